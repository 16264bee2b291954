"""request_rollups*: the acceptance spread as M2 (squared deviations from the mean), not a sum of squares

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-06

A sum of squares loses the spread to cancellation when the rates are close to one another (M2 = sumsq -
sum^2 / n subtracts two nearly equal numbers); the per-second aggregates already keep M2 and merge it
with Chan's formula, and the rollups now do the same. Existing rows get the M2 their sums give (the
best that can be recovered; clamped at 0), then the sum of squares goes.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None

TABLES = ("request_rollups", "request_rollups_hourly")


def upgrade() -> None:
    for table in TABLES:
        op.add_column(table, sa.Column("rate_m2", sa.Double(), nullable=False, server_default=sa.text("0")))
        spread = "rate_sumsq - rate_sum * rate_sum / rate_n"
        op.execute(f"UPDATE {table} SET rate_m2 = CASE WHEN rate_n > 0 AND {spread} > 0 THEN {spread} ELSE 0 END")
        op.drop_column(table, "rate_sumsq")  # in place (SQLite >= 3.35): the key's unique index stays


def downgrade() -> None:
    for table in TABLES:
        op.add_column(table, sa.Column("rate_sumsq", sa.Double(), nullable=False, server_default=sa.text("0")))
        op.execute(f"UPDATE {table} SET rate_sumsq = CASE WHEN rate_n > 0 THEN rate_m2 + rate_sum * rate_sum / rate_n ELSE 0 END")
        op.drop_column(table, "rate_m2")
