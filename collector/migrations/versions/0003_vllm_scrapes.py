"""vllm scrape deltas

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('vllm_scrapes',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('source', sa.String(length=512), nullable=False),
    sa.Column('model', sa.String(length=256), nullable=False),
    sa.Column('engine', sa.String(length=64), nullable=False),
    sa.Column('at', sa.Double(), nullable=False),
    sa.Column('interval_s', sa.Double(), nullable=False),
    sa.Column('counter_reset', sa.Boolean(), nullable=False),
    sa.Column('drafts', sa.Double(), nullable=False),
    sa.Column('draft_tokens', sa.Double(), nullable=False),
    sa.Column('accepted_tokens', sa.Double(), nullable=False),
    sa.Column('accepted_per_position', sa.JSON(), nullable=False),
    sa.Column('ttft_bounds', sa.JSON(), nullable=False),
    sa.Column('ttft_counts', sa.JSON(), nullable=False),
    sa.Column('ttft_sum', sa.Double(), nullable=False),
    sa.Column('e2e_bounds', sa.JSON(), nullable=False),
    sa.Column('e2e_counts', sa.JSON(), nullable=False),
    sa.Column('e2e_sum', sa.Double(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_vllm_scrapes'))
    )
    with op.batch_alter_table('vllm_scrapes', schema=None) as batch_op:
        batch_op.create_index('ix_vllm_scrapes_at', ['at'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('vllm_scrapes', schema=None) as batch_op:
        batch_op.drop_index('ix_vllm_scrapes_at')

    op.drop_table('vllm_scrapes')
