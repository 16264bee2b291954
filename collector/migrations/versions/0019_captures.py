"""captures: sampled prompts and outputs for draft retraining (issue 56)

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-06

Their own table, never columns of `requests`: request reads never touch users' text, and the retention
pass deletes a capture at its `expires_at` (collector.captures.expire_captures). Downgrade drops it.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "captures",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("capture_id", sa.String(length=128), nullable=False),
        sa.Column("tenant", sa.String(length=128), nullable=True),
        sa.Column("instance", sa.String(length=128), nullable=False),
        sa.Column("model", sa.String(length=128), nullable=False),
        sa.Column("drafter", sa.String(length=256), nullable=True),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("tags", sa.JSON(), nullable=False),
        sa.Column("started_at", sa.Double(), nullable=False),
        sa.Column("prompt", sa.JSON(), nullable=False),
        sa.Column("output", sa.Text(), nullable=False),
        sa.Column("prompt_tokens", sa.BigInteger(), nullable=False),
        sa.Column("output_tokens", sa.BigInteger(), nullable=False),
        sa.Column("num_draft_tokens", sa.BigInteger(), nullable=False),
        sa.Column("num_accepted_tokens", sa.BigInteger(), nullable=False),
        sa.Column("truncated", sa.Boolean(), nullable=False),
        sa.Column("redactions", sa.BigInteger(), nullable=False),
        sa.Column("chars", sa.BigInteger(), nullable=False),
        sa.Column("stored_at", sa.Double(), nullable=False),
        sa.Column("expires_at", sa.Double(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_captures")),
        sa.UniqueConstraint("capture_id", name=op.f("uq_captures_capture_id")),
    )
    op.create_index("ix_captures_expires_at", "captures", ["expires_at"])
    op.create_index("ix_captures_tenant_started_at", "captures", ["tenant", "started_at"])


def downgrade() -> None:
    op.drop_index("ix_captures_tenant_started_at", table_name="captures")
    op.drop_index("ix_captures_expires_at", table_name="captures")
    op.drop_table("captures")
