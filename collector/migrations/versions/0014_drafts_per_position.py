"""requests.drafts_per_position: drafts that proposed a token at each position

Revision ID: 0014
Revises: 0013
Create Date: 2026-12-04

Per-position acceptance divides the drafts accepted through position i by the drafts that reached
it. Under a varying draft length (a vLLM `num_speculative_tokens_per_batch_size` schedule, drafts cut
short near max_tokens, the engine's cost-aware lookahead) not every draft reaches gamma. vLLM's
`--per-request-spec-decode-metrics detailed` reports each step's drafted count, from which the
gateway counts them. Rows written before this revision, and producers that do not report it, hold
an empty list: every draft is then taken to reach gamma, as before.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("requests", sa.Column("drafts_per_position", sa.JSON(), nullable=False, server_default="[]"))


def downgrade() -> None:
    # in place (SQLite >= 3.35 drops a column itself): a batch copy of the table would lose 0013's expression index
    op.drop_column("requests", "drafts_per_position")
