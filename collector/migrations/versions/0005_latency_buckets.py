"""rollup latency histograms on the one bucket list, with 0.3 s

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-01

The rollup tables kept TTFT and e2e histograms as 14 columns `<kind>_b00` .. `<kind>_b13`, the
buckets of OLD (bucket i: OLD[i-1] < v <= OLD[i], the last one above 120 s). They now hold the 18
buckets of NEW, `telemetry.schema.LATENCY_BUCKETS` as this revision wrote it, the list the engine's
and the collector's /metrics use too. NEW contains every bound of OLD and adds 0.2, 0.3, 0.75
and 30 s (ADDED), so each old bucket is one new bucket or two.

Old rows are re-expressed, not rebuilt: each count moves to the column of its bucket's upper
bound in NEW, and an old row holds NULL in the buckets of the added bounds ("this row has no
such bound"). A bucket an added bound splits, e.g. (0.25, 0.5] into (0.25, 0.3] and (0.3, 0.5],
so keeps its whole count in the upper part, as a histogram without the 0.3 bound counts it.
Readers merge any sum that includes an old row back onto OLD's bounds (exact, NEW contains
them: `collector.rollups.histogram_of`), so old rows answer what they answered before, and
the roll-up upsert counts a late observation of an added bucket one bucket up in an old row.
Rebuilding rows from raw requests could not cover the rollups' retention: raw rows expire first.

Downgrade folds the added buckets back into the buckets of OLD and drops the extra columns.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

OLD = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 120.0)
NEW = (0.01, 0.025, 0.05, 0.1, 0.2, 0.25, 0.3, 0.5, 0.75, 1.0, 2.5, 5.0, 10.0, 25.0, 30.0, 60.0, 120.0)
ADDED = [j for j, bound in enumerate(NEW) if bound not in OLD]  # nullable: NULL in old rows
TABLES = ("request_rollups", "request_rollups_hourly")
KINDS = ("ttft", "e2e")


def _column(kind: str, i: int) -> str:
    return f"{kind}_b{i:02d}"


def _old_bucket(j: int) -> int:
    """The old bucket with new bucket j's upper bound (the last one: above the largest bound)."""
    return len(OLD) if j == len(NEW) else OLD.index(NEW[j])


def _new_buckets(i: int) -> range:
    """The new buckets old bucket i splits into."""
    first = 0 if i == 0 else NEW.index(OLD[i - 1]) + 1
    last = len(NEW) if i == len(OLD) else NEW.index(OLD[i])
    return range(first, last + 1)


EXTRA = range(len(OLD) + 1, len(NEW) + 1)  # columns past the old `<kind>_b13`


def _columns(buckets) -> list[str]:
    buckets = list(buckets)
    return [_column(kind, j) for kind in KINDS for j in buckets]


def upgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            for column in _columns(EXTRA):
                batch.add_column(sa.Column(column, sa.BigInteger(), nullable=True))
            for column in _columns(j for j in ADDED if j not in EXTRA):
                batch.alter_column(column, existing_type=sa.BigInteger(), nullable=True)
        # every right-hand side reads the row as it was before this UPDATE (SQL, SQLite and PostgreSQL)
        moves = [
            f"{_column(kind, j)} = {'NULL' if j in ADDED else _column(kind, _old_bucket(j))}"
            for kind in KINDS
            for j in range(len(NEW) + 1)
        ]
        op.execute(f"UPDATE {table} SET {', '.join(moves)}")
        with op.batch_alter_table(table) as batch:
            for column in _columns(j for j in EXTRA if j not in ADDED):
                batch.alter_column(column, existing_type=sa.BigInteger(), nullable=False)


def downgrade() -> None:
    for table in TABLES:
        folds = [
            f"{_column(kind, i)} = " + " + ".join(f"COALESCE({_column(kind, j)}, 0)" for j in _new_buckets(i))
            for kind in KINDS
            for i in range(len(OLD) + 1)
        ]
        op.execute(f"UPDATE {table} SET {', '.join(folds)}")
        with op.batch_alter_table(table) as batch:
            for column in _columns(EXTRA):
                batch.drop_column(column)
            for column in _columns(j for j in ADDED if j not in EXTRA):
                batch.alter_column(column, existing_type=sa.BigInteger(), nullable=False)
