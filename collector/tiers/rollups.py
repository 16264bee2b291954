"""Per-minute and per-hour rollups of requests, and retention of raw rows.

Roll-ups are incremental and exact: every pass folds the raw rows inserted since the
last one (ids above `rollup_last_id`) into `request_rollups` (per minute) and
`request_rollups_hourly` with additive upserts, so a late record (a replayed spool, a
long request) lands in its period like any other. On PostgreSQL the pass first locks the
watermark row (`claim_watermark`: concurrent passes run one after the other, so no interval is
counted twice), then takes a SHARE lock on `requests`, which waits for in-flight ingest transactions, so no lower id
can commit after the pass has read past it; on SQLite the store's write lock serialises
the same way.

Retention deletes raw rows older than the raw retention only once they are rolled up
(`id <= rollup_last_id`), and rollups older than their own retention. On PostgreSQL the raw tables
are partitioned by day (`collector.tiers.partitions`): whole days past the retention are dropped first
(a day of requests once all its rows are rolled up), and DELETE then only reaches the boundary day
and the default partition. The window aggregates expire with the raw rows. Tables of packages above the
collector (the alerts' history) expire through those packages' own functions, passed in as `expiries`.

Latency quantiles: each row holds DDSketches of TTFT, e2e and TPOT (migration 0011; the per-second
aggregates' kind, `collector.tiers.sketch`) and the count of requests they cover (`sketched`). SQL cannot
add sketches, so a pass reads the stored sketches of the rows it is about to update (it holds the
watermark, so no other pass writes them meanwhile), merges, and writes the merged ones. The
histograms are kept up to date too: rows written before 0011 have no sketches (`sketched` < `requests`)
and sums that include them read percentiles from the histograms.

Rows written before migration 0005 lack some latency bounds (NULL in `ADDED_BUCKETS`): the
upsert counts new observations of those buckets in the next bucket up, and readers merge every
sum that includes such a row onto the bounds it has (`histogram_of`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from sqlalchemy import ColumnElement, Connection, Engine, Table, delete, func, select, text
from sqlalchemy.dialects.postgresql import insert as postgresql_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from specwatch.collector.db import write_transaction
from specwatch.collector.models import (
    ADDED_BUCKETS,
    LEGACY_LATENCY_BUCKETS,
    DeviceSampleRow,
    EngineEventRow,
    MaintenanceState,
    Request,
    RequestRollup,
    RequestRollupHourly,
    VllmScrape,
    bucket_column_names,
)
from specwatch.collector.tiers import aggregates, partitions, sketch
from specwatch.telemetry.schema import LATENCY_BUCKETS

# Raw rows folded per transaction. Each transaction holds the write lock (SQLite's; on PostgreSQL a SHARE
# lock on `requests`), so ingest waits for it: 200,000 held it 2-3 s on a loaded 2-core machine (ingest's
# p99 2.5 s under 4 producers, bench/ingest.py --latency-only), 10,000 ~0.3 s. Between two, the pass pauses
# as long as the last one took (at least PAUSE_MIN_S, SQLite's busy handler retrying every <= 100 ms),
# so writers waiting for the lock take their turn instead of starving behind a long pass.
CHUNK_ROWS = 10_000
PAUSE_MIN_S = 0.1
LAST_ID, LAST_PASS_AT = "rollup_last_id", "rollup_pass_at"
TTFT_COLUMNS, E2E_COLUMNS = bucket_column_names("ttft"), bucket_column_names("e2e")
KEY_COLUMNS = ("period_start", "instance", "model", "mode", "drafter", "arm")
INT_COLUMNS = (
    "requests",
    "errors",
    "ooms",
    "prompt_tokens",
    "output_tokens",
    "drafts",
    "draft_tokens",
    "accepted_tokens",
    "rate_n",
    "ttft_count",
    *TTFT_COLUMNS,
    *E2E_COLUMNS,
    "sketched",
)
FLOAT_COLUMNS = ("rate_sum", "rate_m2", "ttft_sum", "e2e_sum")  # rate_m2: merged, never added (`_merged_with_stored`)
SKETCH_COLUMNS = aggregates.SKETCHES  # ttft_sketch, e2e_sketch, tpot_sketch
PERIODS = ((RequestRollup.__table__, 60), (RequestRollupHourly.__table__, 3600))
_BOUNDS = np.array(LATENCY_BUCKETS)
# bucket i of LEGACY_LATENCY_BUCKETS spans buckets _LEGACY_STARTS[i] .. _LEGACY_STARTS[i + 1] - 1 of LATENCY_BUCKETS
_LEGACY_STARTS = [0, *(LATENCY_BUCKETS.index(bound) + 1 for bound in LEGACY_LATENCY_BUCKETS)]
# an added bucket -> the next bucket a legacy row has, which holds its observations there
_MERGED_INTO = {i: min(j for j in range(i, len(LATENCY_BUCKETS) + 1) if j not in ADDED_BUCKETS) for i in ADDED_BUCKETS}
RAW_COLUMNS = (
    Request.started_at,
    Request.instance,
    Request.model,
    Request.mode,
    Request.drafter,
    Request.arm,
    Request.status,
    Request.error,
    Request.prompt_tokens,
    Request.output_tokens,
    Request.num_drafts,
    Request.num_draft_tokens,
    Request.num_accepted_tokens,
    Request.ttft_s,
    Request.e2e_s,
    Request.device_s,
)
RAW_NAMES = tuple(c.key for c in RAW_COLUMNS)
ROLLUP_LABELS = KEY_COLUMNS[1:]  # instance, model, mode, drafter, arm ("" for no drafter / no arm)
Aggregates = tuple[list[tuple], np.ndarray, np.ndarray, dict[str, list[sketch.Bins]]]  # keys, ints, floats, sketches
# No stored count may pass this: the columns are int64 (2**63 - 1), and an upsert adds to what a row holds.
# The contract's caps (telemetry.schema.MAX_TOKENS, ...) keep honest sums far below it.
MAX_SUM = 2**62
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class RollupReport:
    rows_folded: int
    last_id: int


def get_state(conn: Connection, key: str) -> float | None:
    return conn.scalar(select(MaintenanceState.value).where(MaintenanceState.key == key))


def set_state(conn: Connection, key: str, value: float) -> None:
    """Upsert (an UPDATE of an existing row: a transaction waiting on its row lock then reads the new value)."""
    upsert = sqlite_insert if conn.dialect.name == "sqlite" else postgresql_insert
    statement = upsert(MaintenanceState).values(key=key, value=value)
    conn.execute(statement.on_conflict_do_update(index_elements=["key"], set_={"value": statement.excluded.value}))


def claim_watermark(conn: Connection) -> int:
    """The last rolled-up request id, its row locked until the transaction ends (PostgreSQL).

    Two passes at once (two replicas both believing they lead, for a moment) would otherwise both
    read the same watermark and fold the same rows twice; the second now waits for the first to
    commit and then reads the watermark it left. Taken before the table lock, so a waiting pass
    does not hold up ingest."""
    if conn.dialect.name != "postgresql":
        return int(get_state(conn, LAST_ID) or 0)  # the store's write lock serialises passes
    conn.execute(
        postgresql_insert(MaintenanceState).values(key=LAST_ID, value=0).on_conflict_do_nothing(index_elements=["key"])
    )
    locked = select(MaintenanceState.value).where(MaintenanceState.key == LAST_ID).with_for_update()
    return int(conn.scalar(locked))


def roll_up(db: Engine, now: float, lock: contextlib.AbstractContextManager | None = None) -> RollupReport:
    """Fold every raw request not rolled up yet into the rollups, CHUNK_ROWS per transaction."""
    folded, last_id = 0, 0
    while True:
        started = time.monotonic()
        with lock or contextlib.nullcontext(), write_transaction(db) as conn:
            last_id = claim_watermark(conn)
            if conn.dialect.name == "postgresql":
                conn.execute(text("LOCK TABLE requests IN SHARE MODE"))
            rows = conn.execute(
                select(Request.id, *RAW_COLUMNS).where(Request.id > last_id).order_by(Request.id).limit(CHUNK_ROWS)
            ).all()
            if rows:
                raw = [row[1:] for row in rows]
                for table, period_s in PERIODS:
                    _upsert(conn, table, aggregate(raw, period_s))
                last_id = rows[-1][0]
                set_state(conn, LAST_ID, last_id)
            set_state(conn, LAST_PASS_AT, now)
        folded += len(rows)
        if len(rows) < CHUNK_ROWS:
            return RollupReport(folded, last_id)
        time.sleep(max(PAUSE_MIN_S, time.monotonic() - started))  # ingest's turn at the lock


def legacy_rows(table) -> ColumnElement[int]:
    """SQL: how many of the summed rows predate migration 0005 (NULL in the added buckets)."""
    return func.count() - func.count(getattr(table, TTFT_COLUMNS[ADDED_BUCKETS[0]]))


def histogram_of(counts: np.ndarray, legacy: float) -> tuple[np.ndarray, tuple[float, ...]]:
    """Summed bucket counts and their bounds. A sum with legacy rows in it has their observations
    of an added bucket in the next one up, so it is merged onto the bounds those rows have
    (exactly: LATENCY_BUCKETS contains them all)."""
    if not legacy:
        return counts, LATENCY_BUCKETS
    return np.add.reduceat(counts, _LEGACY_STARTS), LEGACY_LATENCY_BUCKETS


def _upsert(conn: Connection, table: Table, groups: Aggregates) -> None:
    """Add the aggregates to the stored ones (insert, or add column by column on conflict; the
    sketches are merged with the stored ones here and replace them)."""
    stored, width = _stored(conn, table, groups[0]), len(INT_COLUMNS)
    held = [stored[key][:width] if key in stored else (0,) * width for key in groups[0]]
    held_counts = np.nan_to_num(np.array(held, dtype=float).reshape(len(held), width))  # NULL: a legacy bucket
    keys, ints, floats, sketches = within_int64(groups, held_counts)
    columns = (*KEY_COLUMNS, *INT_COLUMNS, *FLOAT_COLUMNS, *SKETCH_COLUMNS)
    mark = "?" if conn.dialect.name == "sqlite" else "%s"
    sql = (
        f"INSERT INTO {table.name} ({', '.join(columns)}) VALUES ({', '.join([mark] * len(columns))}) "
        f"ON CONFLICT ({', '.join(KEY_COLUMNS)}) DO UPDATE SET "
        + ", ".join(_add_to_stored(table.name, c) for c in (*INT_COLUMNS, *FLOAT_COLUMNS) if c != "rate_m2")
        + "".join(f", {c} = excluded.{c}" for c in ("rate_m2", *SKETCH_COLUMNS))
    )
    m2, blobs = _merged_with_stored(stored, keys, ints, floats, sketches)
    floats = floats.copy()
    floats[:, FLOAT_COLUMNS.index("rate_m2")] = m2
    rows = [key + tuple(i) + tuple(f) + b for key, i, f, b in zip(keys, ints.tolist(), floats.tolist(), blobs)]
    cursor = conn.connection.dbapi_connection.cursor()
    try:
        cursor.executemany(sql, rows)
    finally:
        cursor.close()


def _stored(conn: Connection, table: Table, keys: list[tuple]) -> dict[tuple, tuple]:
    """The stored rows of `keys`' periods: key -> (*INT_COLUMNS, rate_sum, rate_m2, *SKETCH_COLUMNS)."""
    stored: dict[tuple, tuple] = {}
    starts = sorted({key[0] for key in keys})
    for i in range(0, len(starts), 1000):  # bound the IN list (SQLite's variable limit)
        stmt = select(*(table.c[c] for c in (*KEY_COLUMNS, *INT_COLUMNS, *_STORED_MOMENTS, *SKETCH_COLUMNS))).where(
            table.c.period_start.in_(starts[i : i + 1000])
        )
        stored.update({tuple(row[: len(KEY_COLUMNS)]): row[len(KEY_COLUMNS) :] for row in conn.execute(stmt)})
    return stored


_STORED_MOMENTS = ("rate_sum", "rate_m2")


def within_int64(groups: Aggregates, held: np.ndarray | float = 0.0) -> Aggregates:
    """The groups whose every count, added to what its row holds (`held`, per group), stays at most
    MAX_SUM; any other group is refused and logged: a wrapped int64 would be kept for the rollups'
    whole retention (negative token totals)."""
    keys, ints, floats, sketches = groups
    fits = np.all(np.asarray(ints, dtype=float) + held <= MAX_SUM, axis=1)
    if not fits.all():
        for key in (k for k, ok in zip(keys, fits) if not ok):
            log.error("rollup row %s refused: a count would pass %d (int64 would wrap)", key, MAX_SUM)
        kept = np.flatnonzero(fits)
        keys, ints, floats = [keys[i] for i in kept], ints[kept], floats[kept]
        sketches = {name: [bins[i] for i in kept] for name, bins in sketches.items()}
    return keys, np.rint(ints).astype(np.int64), floats, sketches


def _merged_with_stored(
    stored: dict[tuple, tuple], keys: list[tuple], ints: np.ndarray, floats: np.ndarray, sketches: dict
) -> tuple[np.ndarray, list[tuple]]:
    """Per key, the acceptance spread (rate_m2) and the encoded SKETCH_COLUMNS of the new aggregates
    merged with the stored row's (`_stored`, if any): neither adds up column by column."""
    rate_n = INT_COLUMNS.index("rate_n")
    empty = (0.0, 0.0, 0.0, *(None,) * len(SKETCH_COLUMNS))
    old = [(row[rate_n], *row[len(INT_COLUMNS) :]) if (row := stored.get(key)) else empty for key in keys]
    new_moments = np.column_stack(
        [
            ints[:, INT_COLUMNS.index("rate_n")],
            floats[:, FLOAT_COLUMNS.index("rate_sum")],
            floats[:, FLOAT_COLUMNS.index("rate_m2")],
        ]
    )
    old_moments = np.array([row[:3] for row in old], dtype=float).reshape(-1, 3)
    group = np.concatenate([np.arange(len(keys)), np.arange(len(keys))])
    m2 = aggregates.merge_m2(group, len(keys), *np.vstack([old_moments, new_moments]).T)
    names = [c.removesuffix("_sketch") for c in SKETCH_COLUMNS]
    blobs = [
        tuple(
            sketch.encode(sketch.merge([sketch.decode(blob), sketches[name][i]])) for name, blob in zip(names, row[3:])
        )
        for i, row in enumerate(old)
    ]
    return m2, blobs


def _add_to_stored(table: str, column: str) -> str:
    """`column = stored + new`; a legacy row's added bucket stays NULL, its count going one bucket up."""
    sql = f"{column} = {table}.{column} + excluded.{column}"
    for names in (TTFT_COLUMNS, E2E_COLUMNS):
        if column in names:
            for added in (names[i] for i, into in _MERGED_INTO.items() if names[into] == column):
                sql += f" + CASE WHEN {table}.{added} IS NULL THEN excluded.{added} ELSE 0 END"
    return sql


def aggregate(rows: list[tuple], period_s: int) -> Aggregates:
    """Raw rows (in `RAW_COLUMNS` order) -> group keys, their INT_COLUMNS / FLOAT_COLUMNS totals and
    their sketches by name (ttft, e2e, tpot): the per-second tier's aggregate (`aggregates.totals_of`)
    plus what only rollups keep (prompt tokens, TTFT count and sum, e2e sum, latency histograms)."""
    columns = {name: list(values) for name, values in zip(RAW_NAMES, zip(*rows))}
    columns["drafter"], columns["arm"] = ([v or "" for v in columns[c]] for c in ("drafter", "arm"))
    keys, group = aggregates.group_keys(columns, ROLLUP_LABELS, period_s)
    n = len(keys)
    totals = aggregates.totals_of(columns, group, n)
    prompt, ttft, e2e = (np.array(columns[c], dtype=float) for c in ("prompt_tokens", "ttft_s", "e2e_s"))
    has_ttft = ~np.isnan(ttft)
    count = np.bincount(group, weights=has_ttft.astype(float), minlength=n)
    ints = np.column_stack(
        [
            *(totals[c] for c in ("requests", "errors", "ooms")),
            np.bincount(group, weights=prompt, minlength=n),
            *(totals[c] for c in ("output_tokens", "drafts", "draft_tokens", "accepted_tokens", "rate_n")),
            count,
            _histogram(group[has_ttft], ttft[has_ttft], n),
            _histogram(group, e2e, n),
            totals["requests"],  # sketched: every request
        ]
    )
    ttft_sum = np.bincount(group[has_ttft], weights=ttft[has_ttft], minlength=n)
    floats = np.column_stack([totals["rate_sum"], totals["rate_m2"], ttft_sum, np.bincount(group, e2e, minlength=n)])
    sketches = {name: totals[f"{name}_sketch"] for name in ("ttft", "e2e", "tpot")}
    return within_int64((keys, ints, floats, sketches))


def _histogram(group: np.ndarray, values: np.ndarray, n: int) -> np.ndarray:
    """Per-group counts per bucket (bucket i: bounds[i-1] < v <= bounds[i], Prometheus' `le`)."""
    width = len(_BOUNDS) + 1
    flat = group * width + np.searchsorted(_BOUNDS, values, side="left")
    return np.bincount(flat, minlength=n * width).reshape(n, width)


# another package's retention of its own tables: called in the retention transaction with the rollups' cutoff
Expiry = Callable[[Connection, float], object]


def apply_retention(
    db: Engine,
    now: float,
    raw_retention_s: float,
    rollup_retention_s: float,
    lock: contextlib.AbstractContextManager | None = None,
    expiries: Sequence[Expiry] = (),
) -> tuple[int, int]:
    """Remove rolled-up raw requests older than raw_retention_s, old samples/events, and old rollups,
    and run `expiries` (tables of packages above the collector, e.g. `alerts.store.expire_history`);
    the raw requests and the rollup rows removed."""
    cutoff, rollup_cutoff = now - raw_retention_s, now - rollup_retention_s
    dropped = 0
    if db.dialect.name == "postgresql":
        dropped = _drop_partitions(db, cutoff, rollup_cutoff)
    with lock or contextlib.nullcontext(), write_transaction(db) as conn:
        last_id = int(get_state(conn, LAST_ID) or 0)
        raw = conn.execute(delete(Request).where(Request.started_at < cutoff, Request.id <= last_id)).rowcount
        conn.execute(delete(DeviceSampleRow).where(DeviceSampleRow.at < cutoff))
        conn.execute(delete(EngineEventRow).where(EngineEventRow.at < cutoff))
        aggregates.apply_retention(conn, cutoff)
        rolled = sum(
            conn.execute(delete(t).where(t.period_start < rollup_cutoff)).rowcount
            for t in (RequestRollup, RequestRollupHourly)
        )
        conn.execute(delete(VllmScrape).where(VllmScrape.at < rollup_cutoff))  # already compact deltas
        for expire in expiries:
            expire(conn, rollup_cutoff)
    return dropped + raw, rolled


def _drop_partitions(db: Engine, cutoff: float, rollup_cutoff: float) -> int:
    """PostgreSQL: DETACH + DROP the day partitions wholly past their retention; the requests they held."""
    with write_transaction(db) as conn:
        last_id = int(get_state(conn, LAST_ID) or 0)
        dropped = partitions.drop_before(conn, "requests", cutoff, max_id=last_id)
        for table in ("device_samples", "engine_events"):
            partitions.drop_before(conn, table, cutoff)
        partitions.drop_before(conn, "vllm_scrapes", rollup_cutoff)
    return dropped
