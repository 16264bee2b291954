"""vllm_scrapes: generated tokens and whether the engine is configured to speculate

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-06

`generation_tokens` (the delta of vllm:generation_tokens_total) is what drafts are compared with to
tell "drafting is healthy" from "drafting stopped" (collector.reads.speculation); `speculating` is true
when the exposition carries the spec-decode counter families at all (vLLM registers them only with a
speculative config). Rows stored before this revision know neither: 0 tokens, unknown (NULL).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "vllm_scrapes", sa.Column("generation_tokens", sa.Double(), nullable=False, server_default=sa.text("0"))
    )
    op.add_column("vllm_scrapes", sa.Column("speculating", sa.Boolean(), nullable=True))


def downgrade() -> None:
    op.drop_column("vllm_scrapes", "speculating")
    op.drop_column("vllm_scrapes", "generation_tokens")
