"""request_window_aggregates: per-second, per-label-set aggregates behind the window signals

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02

Written at ingest, in the batch's own transaction, from the requests the batch actually stored
(`collector.aggregates`); window signals merge them instead of reading raw rows. Rows are only
ever inserted (several per key are merged when read), so concurrent ingest never contends on one
row. The sketches are DDSketch bins in `collector.sketch`'s encoding.

Requests stored before this revision are not aggregated: `maintenance_state` row
`window_aggregates_from` says from which second on every stored request is, and readers take
raw rows for the part of a window before it. It is the second after the newest stored
`started_at` (0 on an empty database: everything is covered).
"""

from __future__ import annotations

import math

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

TABLE = "request_window_aggregates"
COVERED_FROM = "window_aggregates_from"


def upgrade() -> None:
    op.create_table(
        TABLE,
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("period_start", sa.BigInteger(), nullable=False),
        sa.Column("instance", sa.String(length=128), nullable=False),
        sa.Column("model", sa.String(length=128), nullable=False),
        sa.Column("drafter", sa.String(length=256), nullable=True),
        sa.Column("mode", sa.String(length=16), nullable=False),
        sa.Column("arm", sa.String(length=8), nullable=True),
        *(
            sa.Column(name, sa.BigInteger(), nullable=False)
            for name in (
                "requests",
                "errors",
                "ooms",
                "output_tokens",
                "drafts",
                "draft_tokens",
                "accepted_tokens",
                "rate_n",
                "cost_requests",
                "cost_output_tokens",
            )
        ),
        *(sa.Column(name, sa.Double(), nullable=False) for name in ("rate_sum", "rate_m2", "cost_device_s")),
        *(sa.Column(name, sa.LargeBinary(), nullable=True) for name in ("ttft_sketch", "e2e_sketch", "tpot_sketch")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_request_window_aggregates")),
    )
    op.create_index("ix_request_window_aggregates_period_start", TABLE, ["period_start"])
    newest = op.get_bind().scalar(sa.text("SELECT max(started_at) FROM requests"))
    covered_from = 0 if newest is None else math.floor(newest) + 1
    op.execute(sa.text("DELETE FROM maintenance_state WHERE key = :key").bindparams(key=COVERED_FROM))
    op.execute(
        sa.text("INSERT INTO maintenance_state (key, value) VALUES (:key, :value)").bindparams(
            key=COVERED_FROM, value=float(covered_from)
        )
    )


def downgrade() -> None:
    op.execute(sa.text("DELETE FROM maintenance_state WHERE key = :key").bindparams(key=COVERED_FROM))
    op.drop_index("ix_request_window_aggregates_period_start", table_name=TABLE)
    op.drop_table(TABLE)
