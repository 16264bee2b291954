"""per-minute and per-hour request rollups

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('maintenance_state',
    sa.Column('key', sa.String(length=64), nullable=False),
    sa.Column('value', sa.Double(), nullable=False),
    sa.PrimaryKeyConstraint('key', name=op.f('pk_maintenance_state'))
    )
    op.create_table('request_rollups',
    sa.Column('period_start', sa.BigInteger(), nullable=False),
    sa.Column('instance', sa.String(length=128), nullable=False),
    sa.Column('model', sa.String(length=128), nullable=False),
    sa.Column('mode', sa.String(length=16), nullable=False),
    sa.Column('drafter', sa.String(length=256), nullable=False),
    sa.Column('arm', sa.String(length=8), nullable=False),
    sa.Column('requests', sa.BigInteger(), nullable=False),
    sa.Column('errors', sa.BigInteger(), nullable=False),
    sa.Column('ooms', sa.BigInteger(), nullable=False),
    sa.Column('prompt_tokens', sa.BigInteger(), nullable=False),
    sa.Column('output_tokens', sa.BigInteger(), nullable=False),
    sa.Column('drafts', sa.BigInteger(), nullable=False),
    sa.Column('draft_tokens', sa.BigInteger(), nullable=False),
    sa.Column('accepted_tokens', sa.BigInteger(), nullable=False),
    sa.Column('rate_n', sa.BigInteger(), nullable=False),
    sa.Column('ttft_count', sa.BigInteger(), nullable=False),
    sa.Column('ttft_b00', sa.BigInteger(), nullable=False),
    sa.Column('ttft_b01', sa.BigInteger(), nullable=False),
    sa.Column('ttft_b02', sa.BigInteger(), nullable=False),
    sa.Column('ttft_b03', sa.BigInteger(), nullable=False),
    sa.Column('ttft_b04', sa.BigInteger(), nullable=False),
    sa.Column('ttft_b05', sa.BigInteger(), nullable=False),
    sa.Column('ttft_b06', sa.BigInteger(), nullable=False),
    sa.Column('ttft_b07', sa.BigInteger(), nullable=False),
    sa.Column('ttft_b08', sa.BigInteger(), nullable=False),
    sa.Column('ttft_b09', sa.BigInteger(), nullable=False),
    sa.Column('ttft_b10', sa.BigInteger(), nullable=False),
    sa.Column('ttft_b11', sa.BigInteger(), nullable=False),
    sa.Column('ttft_b12', sa.BigInteger(), nullable=False),
    sa.Column('ttft_b13', sa.BigInteger(), nullable=False),
    sa.Column('e2e_b00', sa.BigInteger(), nullable=False),
    sa.Column('e2e_b01', sa.BigInteger(), nullable=False),
    sa.Column('e2e_b02', sa.BigInteger(), nullable=False),
    sa.Column('e2e_b03', sa.BigInteger(), nullable=False),
    sa.Column('e2e_b04', sa.BigInteger(), nullable=False),
    sa.Column('e2e_b05', sa.BigInteger(), nullable=False),
    sa.Column('e2e_b06', sa.BigInteger(), nullable=False),
    sa.Column('e2e_b07', sa.BigInteger(), nullable=False),
    sa.Column('e2e_b08', sa.BigInteger(), nullable=False),
    sa.Column('e2e_b09', sa.BigInteger(), nullable=False),
    sa.Column('e2e_b10', sa.BigInteger(), nullable=False),
    sa.Column('e2e_b11', sa.BigInteger(), nullable=False),
    sa.Column('e2e_b12', sa.BigInteger(), nullable=False),
    sa.Column('e2e_b13', sa.BigInteger(), nullable=False),
    sa.Column('rate_sum', sa.Double(), nullable=False),
    sa.Column('rate_sumsq', sa.Double(), nullable=False),
    sa.Column('ttft_sum', sa.Double(), nullable=False),
    sa.Column('e2e_sum', sa.Double(), nullable=False),
    sa.PrimaryKeyConstraint('period_start', 'instance', 'model', 'mode', 'drafter', 'arm', name=op.f('pk_request_rollups'))
    )
    op.create_table('request_rollups_hourly',
    sa.Column('period_start', sa.BigInteger(), nullable=False),
    sa.Column('instance', sa.String(length=128), nullable=False),
    sa.Column('model', sa.String(length=128), nullable=False),
    sa.Column('mode', sa.String(length=16), nullable=False),
    sa.Column('drafter', sa.String(length=256), nullable=False),
    sa.Column('arm', sa.String(length=8), nullable=False),
    sa.Column('requests', sa.BigInteger(), nullable=False),
    sa.Column('errors', sa.BigInteger(), nullable=False),
    sa.Column('ooms', sa.BigInteger(), nullable=False),
    sa.Column('prompt_tokens', sa.BigInteger(), nullable=False),
    sa.Column('output_tokens', sa.BigInteger(), nullable=False),
    sa.Column('drafts', sa.BigInteger(), nullable=False),
    sa.Column('draft_tokens', sa.BigInteger(), nullable=False),
    sa.Column('accepted_tokens', sa.BigInteger(), nullable=False),
    sa.Column('rate_n', sa.BigInteger(), nullable=False),
    sa.Column('ttft_count', sa.BigInteger(), nullable=False),
    sa.Column('ttft_b00', sa.BigInteger(), nullable=False),
    sa.Column('ttft_b01', sa.BigInteger(), nullable=False),
    sa.Column('ttft_b02', sa.BigInteger(), nullable=False),
    sa.Column('ttft_b03', sa.BigInteger(), nullable=False),
    sa.Column('ttft_b04', sa.BigInteger(), nullable=False),
    sa.Column('ttft_b05', sa.BigInteger(), nullable=False),
    sa.Column('ttft_b06', sa.BigInteger(), nullable=False),
    sa.Column('ttft_b07', sa.BigInteger(), nullable=False),
    sa.Column('ttft_b08', sa.BigInteger(), nullable=False),
    sa.Column('ttft_b09', sa.BigInteger(), nullable=False),
    sa.Column('ttft_b10', sa.BigInteger(), nullable=False),
    sa.Column('ttft_b11', sa.BigInteger(), nullable=False),
    sa.Column('ttft_b12', sa.BigInteger(), nullable=False),
    sa.Column('ttft_b13', sa.BigInteger(), nullable=False),
    sa.Column('e2e_b00', sa.BigInteger(), nullable=False),
    sa.Column('e2e_b01', sa.BigInteger(), nullable=False),
    sa.Column('e2e_b02', sa.BigInteger(), nullable=False),
    sa.Column('e2e_b03', sa.BigInteger(), nullable=False),
    sa.Column('e2e_b04', sa.BigInteger(), nullable=False),
    sa.Column('e2e_b05', sa.BigInteger(), nullable=False),
    sa.Column('e2e_b06', sa.BigInteger(), nullable=False),
    sa.Column('e2e_b07', sa.BigInteger(), nullable=False),
    sa.Column('e2e_b08', sa.BigInteger(), nullable=False),
    sa.Column('e2e_b09', sa.BigInteger(), nullable=False),
    sa.Column('e2e_b10', sa.BigInteger(), nullable=False),
    sa.Column('e2e_b11', sa.BigInteger(), nullable=False),
    sa.Column('e2e_b12', sa.BigInteger(), nullable=False),
    sa.Column('e2e_b13', sa.BigInteger(), nullable=False),
    sa.Column('rate_sum', sa.Double(), nullable=False),
    sa.Column('rate_sumsq', sa.Double(), nullable=False),
    sa.Column('ttft_sum', sa.Double(), nullable=False),
    sa.Column('e2e_sum', sa.Double(), nullable=False),
    sa.PrimaryKeyConstraint('period_start', 'instance', 'model', 'mode', 'drafter', 'arm', name=op.f('pk_request_rollups_hourly'))
    )


def downgrade() -> None:
    op.drop_table('request_rollups_hourly')
    op.drop_table('request_rollups')
    op.drop_table('maintenance_state')
