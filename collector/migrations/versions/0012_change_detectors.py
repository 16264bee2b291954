"""the change detectors' tables: series state, cursors, per-request flags

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-02

`alert_detector_series` holds each drift series' baseline and CUSUM and each regression comparison
at a deploy marker (alerts.baselines, alerts.regression), so a restarted leader resumes where it
stopped; `alert_detector_cursors` the last request id each pass read; `request_flags` the
per-request anomalies (outlier, repetition, collapse) the Requests page filters on. The tables are
defined in alerts/tables.py. Downgrade drops them.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "alert_detector_series",
        sa.Column("series", sa.String(length=64), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("labels", sa.JSON(), nullable=False),
        sa.Column("value", sa.Double(), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.Column("significant", sa.Boolean(), nullable=False),
        sa.Column("annotations", sa.JSON(), nullable=False),
        sa.Column("state", sa.JSON(), nullable=False),
        sa.Column("updated_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("series", name=op.f("pk_alert_detector_series")),
    )
    op.create_index("ix_alert_detector_series_kind_updated_at", "alert_detector_series", ["kind", "updated_at"])
    op.create_table(
        "alert_detector_cursors",
        sa.Column("name", sa.String(length=64), nullable=False),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_alert_detector_cursors")),
    )
    op.create_table(
        "request_flags",
        sa.Column("request_id", sa.String(length=128), nullable=False),
        sa.Column("flag", sa.String(length=16), nullable=False),
        sa.Column("started_at", sa.Double(), nullable=False),
        sa.Column("instance", sa.String(length=128), nullable=False),
        sa.Column("model", sa.String(length=128), nullable=False),
        sa.Column("drafter", sa.String(length=256), nullable=True),
        sa.Column("value", sa.Double(), nullable=False),
        sa.Column("expected", sa.Double(), nullable=False),
        sa.Column("detail", sa.JSON(), nullable=False),
        sa.Column("flagged_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("request_id", "flag", name=op.f("pk_request_flags")),
    )
    op.create_index("ix_request_flags_started_at", "request_flags", ["started_at"])
    op.create_index("ix_request_flags_flag_started_at", "request_flags", ["flag", "started_at"])


def downgrade() -> None:
    op.drop_table("request_flags")
    op.drop_table("alert_detector_cursors")
    op.drop_table("alert_detector_series")
