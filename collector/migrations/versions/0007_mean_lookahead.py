"""requests.mean_lookahead: the mean draft length the engine chose per round

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-01

The engine picks each round's lookahead (at most gamma) from its measured verify cost
curve and recent acceptance; a record carries the mean of those choices. Rows written
before this revision, and records from producers that do not report it, hold NULL.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.add_column(sa.Column("mean_lookahead", sa.Double(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.drop_column("mean_lookahead")
