"""requests, device samples, engine events

Revision ID: 0001
Revises:
Create Date: 2026-11-29
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('device_samples',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('instance', sa.String(length=128), nullable=False),
    sa.Column('at', sa.Double(), nullable=False),
    sa.Column('device', sa.String(length=128), nullable=False),
    sa.Column('mem_allocated_bytes', sa.BigInteger(), nullable=False),
    sa.Column('mem_reserved_bytes', sa.BigInteger(), nullable=False),
    sa.Column('fragmentation', sa.Double(), nullable=True),
    sa.Column('power_w', sa.Double(), nullable=True),
    sa.Column('power_source', sa.String(length=16), nullable=True),
    sa.Column('util_target', sa.Double(), nullable=True),
    sa.Column('util_draft', sa.Double(), nullable=True),
    sa.Column('active_requests', sa.BigInteger(), nullable=False),
    sa.Column('queue_depth', sa.BigInteger(), nullable=False),
    sa.Column('load', sa.Double(), nullable=True),
    sa.Column('draft_loaded', sa.Boolean(), nullable=True),
    sa.Column('default_mode', sa.String(length=16), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_device_samples')),
    sa.UniqueConstraint('instance', 'device', 'at', name='uq_device_samples_instance_device_at')
    )
    op.create_index('ix_device_samples_at', 'device_samples', ['at'], unique=False)

    op.create_table('engine_events',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('instance', sa.String(length=128), nullable=False),
    sa.Column('at', sa.Double(), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('detail', sa.JSON(), nullable=False),
    sa.Column('duration_s', sa.Double(), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_engine_events')),
    sa.UniqueConstraint('instance', 'kind', 'at', name='uq_engine_events_instance_kind_at')
    )
    op.create_index('ix_engine_events_at', 'engine_events', ['at'], unique=False)

    op.create_table('requests',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('request_id', sa.String(length=128), nullable=False),
    sa.Column('instance', sa.String(length=128), nullable=False),
    sa.Column('model', sa.String(length=128), nullable=False),
    sa.Column('drafter', sa.String(length=256), nullable=True),
    sa.Column('mode', sa.String(length=16), nullable=False),
    sa.Column('mode_reason', sa.String(length=16), nullable=False),
    sa.Column('arm', sa.String(length=8), nullable=True),
    sa.Column('started_at', sa.Double(), nullable=False),
    sa.Column('queue_s', sa.Double(), nullable=False),
    sa.Column('ttft_s', sa.Double(), nullable=True),
    sa.Column('e2e_s', sa.Double(), nullable=False),
    sa.Column('prompt_tokens', sa.BigInteger(), nullable=False),
    sa.Column('output_tokens', sa.BigInteger(), nullable=False),
    sa.Column('num_drafts', sa.BigInteger(), nullable=False),
    sa.Column('num_draft_tokens', sa.BigInteger(), nullable=False),
    sa.Column('num_accepted_tokens', sa.BigInteger(), nullable=False),
    sa.Column('accepted_per_position', sa.JSON(), nullable=False),
    sa.Column('gamma', sa.Integer(), nullable=False),
    sa.Column('draft_s', sa.Double(), nullable=False),
    sa.Column('verify_s', sa.Double(), nullable=False),
    sa.Column('retries', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('error', sa.String(length=256), nullable=True),
    sa.Column('energy_j', sa.Double(), nullable=True),
    sa.Column('energy_source', sa.String(length=16), nullable=True),
    sa.Column('load_at_admission', sa.Double(), nullable=True),
    sa.Column('tags', sa.JSON(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_requests')),
    sa.UniqueConstraint('request_id', name=op.f('uq_requests_request_id'))
    )
    op.create_index('ix_requests_instance_started_at', 'requests', ['instance', 'started_at'], unique=False)
    op.create_index('ix_requests_started_at', 'requests', ['started_at'], unique=False)


def downgrade() -> None:
    op.drop_index('ix_requests_started_at', 'requests')
    op.drop_index('ix_requests_instance_started_at', 'requests')

    op.drop_table('requests')
    op.drop_index('ix_engine_events_at', 'engine_events')

    op.drop_table('engine_events')
    op.drop_index('ix_device_samples_at', 'device_samples')

    op.drop_table('device_samples')
