"""requests.failed_device_s: the device seconds of a retried request's failed attempts

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-06

A request that failed and was retried costs the failed attempt's device time too; it is part of its
device_s. The cost model books that part as the arm's retries line. Until now the split was assumed
(k retries: k/(k+1) of device_s, each attempt taken as costing the same); the bundled engine now
reports the failed attempts' seconds, and the split is measured where a record carries them. Rows
written before this revision, and producers that cannot tell (a gateway retrying an upstream), hold
NULL: the assumed split stands for them, and the assumptions table says how many.
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("requests", sa.Column("failed_device_s", sa.Double(), nullable=True))


def downgrade() -> None:
    op.drop_column("requests", "failed_device_s")
