"""indexes for the Requests listing's sorts

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-03

`GET /v1/requests` (`collector.request_reads.list_requests`) sorts by TTFT, e2e or acceptance and
pages by keyset (value, id). Each sort walks its index in order and stops after a page, so a page
costs the same on a million-request store: `ix_requests_ttft_s_id`, `ix_requests_e2e_s_id` and
`ix_requests_acceptance`, an expression index on accepted / drafted tokens (NULL without drafts;
the query repeats the expression exactly, `collector.models.ACCEPTANCE_SQL`). Downgrade drops them.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None

ACCEPTANCE_SQL = "(num_accepted_tokens * 1.0 / NULLIF(num_draft_tokens, 0))"  # = collector.models.ACCEPTANCE_SQL


def upgrade() -> None:
    op.create_index("ix_requests_ttft_s_id", "requests", ["ttft_s", "id"])
    op.create_index("ix_requests_e2e_s_id", "requests", ["e2e_s", "id"])
    op.create_index("ix_requests_acceptance", "requests", [sa.text(ACCEPTANCE_SQL), "id"])


def downgrade() -> None:
    for name in ("ix_requests_acceptance", "ix_requests_e2e_s_id", "ix_requests_ttft_s_id"):
        op.drop_index(name, table_name="requests")
