"""alert state, history, outbox and actions

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-29 21:02:06.411835
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('alert_actions',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('at', sa.Double(), nullable=False),
    sa.Column('rule', sa.String(length=128), nullable=False),
    sa.Column('fingerprint', sa.String(length=16), nullable=False),
    sa.Column('action', sa.String(length=64), nullable=False),
    sa.Column('instance', sa.String(length=128), nullable=True),
    sa.Column('outcome', sa.String(length=16), nullable=False),
    sa.Column('detail', sa.JSON(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_alert_actions'))
    )
    with op.batch_alter_table('alert_actions', schema=None) as batch_op:
        batch_op.create_index('ix_alert_actions_at', ['at'], unique=False)

    op.create_table('alert_notifications',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('key', sa.String(length=64), nullable=False),
    sa.Column('receiver', sa.String(length=64), nullable=False),
    sa.Column('rule', sa.String(length=128), nullable=False),
    sa.Column('alert_status', sa.String(length=16), nullable=False),
    sa.Column('payload', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.Double(), nullable=False),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('attempts', sa.Integer(), nullable=False),
    sa.Column('next_attempt_at', sa.Double(), nullable=False),
    sa.Column('last_error', sa.String(length=1024), nullable=True),
    sa.Column('delivered_at', sa.Double(), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_alert_notifications')),
    sa.UniqueConstraint('key', name=op.f('uq_alert_notifications_key'))
    )
    with op.batch_alter_table('alert_notifications', schema=None) as batch_op:
        batch_op.create_index('ix_alert_notifications_status_next_attempt_at', ['status', 'next_attempt_at'], unique=False)

    op.create_table('alert_rule_health',
    sa.Column('rule', sa.String(length=128), nullable=False),
    sa.Column('evaluated_at', sa.Double(), nullable=False),
    sa.Column('duration_s', sa.Double(), nullable=False),
    sa.Column('error', sa.String(length=1024), nullable=True),
    sa.PrimaryKeyConstraint('rule', name=op.f('pk_alert_rule_health'))
    )
    op.create_table('alert_states',
    sa.Column('fingerprint', sa.String(length=16), nullable=False),
    sa.Column('rule', sa.String(length=128), nullable=False),
    sa.Column('labels', sa.JSON(), nullable=False),
    sa.Column('annotations', sa.JSON(), nullable=False),
    sa.Column('state', sa.String(length=16), nullable=False),
    sa.Column('value', sa.Double(), nullable=False),
    sa.Column('active_at', sa.Double(), nullable=False),
    sa.Column('last_seen_at', sa.Double(), nullable=False),
    sa.Column('fired_at', sa.Double(), nullable=True),
    sa.Column('resolved_at', sa.Double(), nullable=True),
    sa.Column('last_sent_at', sa.Double(), nullable=True),
    sa.PrimaryKeyConstraint('fingerprint', name=op.f('pk_alert_states'))
    )
    op.create_table('alert_transitions',
    sa.Column('id', sa.BigInteger().with_variant(sa.Integer(), 'sqlite'), autoincrement=True, nullable=False),
    sa.Column('at', sa.Double(), nullable=False),
    sa.Column('rule', sa.String(length=128), nullable=False),
    sa.Column('fingerprint', sa.String(length=16), nullable=False),
    sa.Column('labels', sa.JSON(), nullable=False),
    sa.Column('from_state', sa.String(length=16), nullable=False),
    sa.Column('to_state', sa.String(length=16), nullable=False),
    sa.Column('value', sa.Double(), nullable=False),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_alert_transitions'))
    )
    with op.batch_alter_table('alert_transitions', schema=None) as batch_op:
        batch_op.create_index('ix_alert_transitions_at', ['at'], unique=False)



def downgrade() -> None:
    with op.batch_alter_table('alert_transitions', schema=None) as batch_op:
        batch_op.drop_index('ix_alert_transitions_at')

    op.drop_table('alert_transitions')
    op.drop_table('alert_states')
    op.drop_table('alert_rule_health')
    with op.batch_alter_table('alert_notifications', schema=None) as batch_op:
        batch_op.drop_index('ix_alert_notifications_status_next_attempt_at')

    op.drop_table('alert_notifications')
    with op.batch_alter_table('alert_actions', schema=None) as batch_op:
        batch_op.drop_index('ix_alert_actions_at')

    op.drop_table('alert_actions')
