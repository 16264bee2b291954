"""requests.draft_counts_known: records whose draft counts the producer could not see

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01

A gateway in front of a vLLM server started without `--per-request-spec-decode-metrics`
still records each request's timings and tokens, but not its drafts: such a row has
`draft_counts_known = false` (its counts are 0) and acceptance queries skip it. Every
row written before this revision came from a producer that counted its drafts: true.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.add_column(sa.Column("draft_counts_known", sa.Boolean(), server_default=sa.true(), nullable=False))


def downgrade() -> None:
    with op.batch_alter_table("requests") as batch:
        batch.drop_column("draft_counts_known")
