"""rollups carry the per-second aggregates' DDSketches of TTFT, e2e and TPOT

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-02

`request_rollups` and `request_rollups_hourly` gain `ttft_sketch`, `e2e_sketch`, `tpot_sketch`
(`collector.sketch`'s encoding, the one `request_window_aggregates` uses; NULL: no value) and
`sketched`, how many of the row's requests the sketches cover. The roll-up pass merges the
sketches of the requests it folds into the stored ones, so every tier of the read path answers
percentiles from the same sketch type, TPOT included.

Rows written before this revision are not rebuilt: they get `sketched` = 0 and keep their
histograms. A sum that includes such a row (sketched < requests; a late request folded into an
old row later leaves it so) reads its TTFT and e2e percentiles from the histograms, as before,
marked `basis="histogram"`, and no TPOT. Rebuilding them from raw rows would cover only the raw
retention (14 days by default) of the rollups' 400; those rows age out with the rollup retention.

Downgrade drops the four columns (the histograms were kept up to date throughout).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None

TABLES = ("request_rollups", "request_rollups_hourly")
SKETCHES = ("ttft_sketch", "e2e_sketch", "tpot_sketch")


def upgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            batch.add_column(sa.Column("sketched", sa.BigInteger(), server_default=sa.text("0"), nullable=False))
            for name in SKETCHES:
                batch.add_column(sa.Column(name, sa.LargeBinary(), nullable=True))


def downgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table) as batch:
            for name in ("sketched", *SKETCHES):
                batch.drop_column(name)
