"""request_window_aggregates: the span of the work (first start, last finish) per row

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-06

Rates divide by the time the work took: from the first request's start to the last one's finish
(start + e2e), clipped to the window (issue 57: a span ending at the last start + 1 s rated a load that
stops inside the window 18% high). Rows stored before this revision keep nulls, read as their second.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

TABLE = "request_window_aggregates"


def upgrade() -> None:
    op.add_column(TABLE, sa.Column("first_start_s", sa.Double(), nullable=True))
    op.add_column(TABLE, sa.Column("last_end_s", sa.Double(), nullable=True))


def downgrade() -> None:
    op.drop_column(TABLE, "last_end_s")
    op.drop_column(TABLE, "first_start_s")
