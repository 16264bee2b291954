"""requests.device_s, device_s_source: the device seconds a request used, and how they were attributed

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01

The engine splits each batched target forward among the requests in it by their share of the
forward's token rows, and charges each request's own steps (prefill, draft) to it alone
(`engine`); a gateway gives each request in flight at an upstream 1/n of every interval with n
in flight (`processor_sharing`). Rows written before this revision, and records from producers
that do not report it, hold NULL in both.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.add_column(sa.Column("device_s", sa.Double(), nullable=True))
        batch.add_column(sa.Column("device_s_source", sa.String(length=24), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.drop_column("device_s_source")
        batch.drop_column("device_s")
