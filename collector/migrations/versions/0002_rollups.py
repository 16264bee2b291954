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
    _create_rollup_table('request_rollups')
    _create_rollup_table('request_rollups_hourly')


BUCKETS = 14  # TTFT and e2e histogram buckets when written (0005 extends them to telemetry.schema.LATENCY_BUCKETS)
KEYS = [('instance', 128), ('model', 128), ('mode', 16), ('drafter', 256), ('arm', 8)]
COUNTS = ['requests', 'errors', 'ooms', 'prompt_tokens', 'output_tokens', 'drafts', 'draft_tokens',
          'accepted_tokens', 'rate_n', 'ttft_count']
SUMS = ['rate_sum', 'rate_sumsq', 'ttft_sum', 'e2e_sum']


def _create_rollup_table(name: str) -> None:
    """The per-minute and per-hour tables share one layout."""
    buckets = [f'{kind}_b{i:02d}' for kind in ('ttft', 'e2e') for i in range(BUCKETS)]
    op.create_table(name,
    sa.Column('period_start', sa.BigInteger(), nullable=False),
    *[sa.Column(key, sa.String(length=length), nullable=False) for key, length in KEYS],
    *[sa.Column(column, sa.BigInteger(), nullable=False) for column in COUNTS + buckets],
    *[sa.Column(column, sa.Double(), nullable=False) for column in SUMS],
    sa.PrimaryKeyConstraint('period_start', *[key for key, _ in KEYS], name=op.f(f'pk_{name}'))
    )


def downgrade() -> None:
    op.drop_table('request_rollups_hourly')
    op.drop_table('request_rollups')
    op.drop_table('maintenance_state')
