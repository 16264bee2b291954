"""Per-second, per-label-set aggregates of requests: what window signals merge instead of raw rows.

One row holds, for the requests of one label set (instance, model, drafter, mode, arm: the
labels alert rules group request signals by) that started in one second, everything the window
signals need, in mergeable form:
  * counts and sums: requests, errors, OOM errors, output tokens, drafts, draft and accepted
    tokens; for spec_cost_excess the ok requests with output and device time, their device
    seconds and output tokens;
  * the per-request acceptance rate over requests that drafted as (n, sum, M2 = sum of squared
    deviations from the row's mean): rows merge exactly with Chan's formula, and unlike a raw
    sum of squares M2 does not cancel catastrophically when every rate is the same;
  * DDSketches (`collector.tiers.sketch`, 1% relative accuracy) of TTFT, e2e and TPOT;
  * the span of the work: the first request's start and the last one's finish (start + e2e).

Why per second: a window's ends rarely fall on a period boundary, and the partial periods at
its ends are read from raw rows. With one-second periods those are < 1 s of requests at each
end (~3k rows at 1M requests per 5 minutes) while 5 minutes is at most 300 rows per label set.
Tags are not part of the key (unbounded: tenants, scenarios); filters on tags read raw rows.

Rows are written at ingest in the batch's transaction, from the requests the batch actually
stored (a resent batch adds nothing), and only ever inserted: concurrent writers never update
one row, and readers merge the several rows a key may have. `window_aggregates_from` (in
`maintenance_state`) is the first second from which every stored request is aggregated
(migration 0009 sets it; retention moves it forward).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from sqlalchemy import BigInteger, ColumnElement, Connection, Double, Index, LargeBinary, String, case, delete, func
from sqlalchemy.orm import Mapped, mapped_column

from specwatch.collector.models import Base, BigId, MaintenanceState
from specwatch.collector.tiers import sketch

PERIOD_S = 1
COVERED_FROM = "window_aggregates_from"
LABELS = ("instance", "model", "drafter", "mode", "arm")
# the request fields an aggregate is computed from
SOURCE_FIELDS = (
    "started_at",
    *LABELS,
    "status",
    "error",
    "output_tokens",
    "num_drafts",
    "num_draft_tokens",
    "num_accepted_tokens",
    "ttft_s",
    "e2e_s",
    "device_s",
)
COUNTS = (
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
SUMS = ("rate_sum", "cost_device_s")
SKETCHES = ("ttft_sketch", "e2e_sketch", "tpot_sketch")


class WindowAggregate(Base):
    """Aggregates of one label set's requests that started in one second (see the module doc)."""

    __tablename__ = "request_window_aggregates"
    __table_args__ = (Index("ix_request_window_aggregates_period_start", "period_start"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    period_start: Mapped[int] = mapped_column(BigInteger)
    instance: Mapped[str] = mapped_column(String(128))
    model: Mapped[str] = mapped_column(String(128))
    drafter: Mapped[str | None] = mapped_column(String(256))
    mode: Mapped[str] = mapped_column(String(16))
    arm: Mapped[str | None] = mapped_column(String(8))
    locals().update({name: mapped_column(BigInteger, nullable=False) for name in COUNTS})
    rate_sum: Mapped[float] = mapped_column(Double)
    rate_m2: Mapped[float] = mapped_column(Double)
    cost_device_s: Mapped[float] = mapped_column(Double)
    # the work's span: the first request's start, the last one's finish (start + e2e); null in rows stored
    # before migration 0017, read as their second's start and end
    first_start_s: Mapped[float | None] = mapped_column(Double)
    last_end_s: Mapped[float | None] = mapped_column(Double)
    ttft_sketch: Mapped[bytes | None] = mapped_column(LargeBinary)
    e2e_sketch: Mapped[bytes | None] = mapped_column(LargeBinary)
    tpot_sketch: Mapped[bytes | None] = mapped_column(LargeBinary)


STORED_COLUMNS = ("period_start", *LABELS, *COUNTS, *SUMS, "rate_m2", "first_start_s", "last_end_s", *SKETCHES)


def columns_of_records(records: Sequence[Any]) -> dict[str, list]:
    """Request records (schema objects) -> SOURCE_FIELDS columns."""
    dicts = [record.__dict__ for record in records]
    return {name: [d[name] for d in dicts] for name in SOURCE_FIELDS}


def columns_of_rows(rows: Sequence[Sequence[Any]], names: Sequence[str]) -> dict[str, list]:
    """Rows (tuples in `names` order) -> SOURCE_FIELDS columns."""
    transposed = list(zip(*rows)) if rows else [() for _ in names]
    by_name = dict(zip(names, transposed))
    return {name: list(by_name[name]) for name in SOURCE_FIELDS}


def group_index(keys: Sequence[tuple]) -> tuple[list[tuple], np.ndarray]:
    """Distinct keys (first-seen order) and each row's position among them."""
    index: dict[tuple, int] = {}
    group = np.fromiter((index.setdefault(k, len(index)) for k in keys), dtype=np.int64, count=len(keys))
    return list(index), group


def aggregate(columns: dict[str, list], key_names: Sequence[str], per_second: bool) -> tuple[list[tuple], dict]:
    """Group requests by `key_names` (label names), and by second when `per_second`; returns the
    keys (the second first) and, per key, COUNTS, SUMS, rate_m2, the span (first_s, last_s: the
    first second's start, the last one's end) and the three sketches (Bins)."""
    keys, group = group_keys(columns, key_names, PERIOD_S if per_second else None)
    return keys, totals_of(columns, group, len(keys))


def group_keys(
    columns: dict[str, list], key_names: Sequence[str], period_s: int | None
) -> tuple[list[tuple], np.ndarray]:
    """Distinct keys (the period's start first when `period_s`, then the labels) and each row's group."""
    n_rows = len(columns["started_at"])
    labels = [columns[name] for name in key_names]
    if period_s is None:
        return group_index(list(zip(*labels)) or [()] * n_rows)
    started = np.asarray(columns["started_at"], dtype=float)
    periods = (np.floor(started / period_s) * period_s).astype(np.int64).tolist()
    return group_index(list(zip(periods, *labels)))


def merge_m2(group: np.ndarray, n: int, rate_n, rate_sum, rate_m2) -> np.ndarray:
    """The one merge of acceptance spreads: per group, the pieces' M2 (sum of squared deviations from
    their own mean) merged exactly: sum of M2_i + n_i (mean_i - mean)^2 (Chan et al.). Never from a sum
    of squares, which cancels catastrophically when the rates are close to one another."""
    rate_n, rate_sum, rate_m2 = (np.asarray(v, dtype=float) for v in (rate_n, rate_sum, rate_m2))
    total_n, total = np.bincount(group, rate_n, minlength=n), np.bincount(group, rate_sum, minlength=n)
    mean = np.divide(total, total_n, out=np.zeros(n), where=total_n > 0)
    piece_mean = np.divide(rate_sum, rate_n, out=np.zeros_like(rate_sum), where=rate_n > 0)
    spread = rate_n * (piece_mean - mean[group]) ** 2
    return np.bincount(group, weights=rate_m2 + spread, minlength=n)


def sql_merged_m2(table, mean) -> ColumnElement[float]:
    """`merge_m2` in SQL over the rows summed: `mean` is the summed rows' mean acceptance rate (a
    subquery's column or a scalar subquery)."""
    deviation = table.rate_sum / table.rate_n - mean
    return func.sum(table.rate_m2 + case((table.rate_n > 0, table.rate_n * deviation * deviation), else_=0.0))


def _floats(values: list) -> np.ndarray:
    return np.array([np.nan if v is None else v for v in values], dtype=float)


def totals_of(columns: dict[str, list], group: np.ndarray, n: int) -> dict:
    """Per group: COUNTS, SUMS, rate_m2, the span and the three sketches (the one aggregate definition
    every tier stores or reads)."""

    def total(weights: np.ndarray, where: np.ndarray | None = None) -> np.ndarray:
        if where is None:
            return np.bincount(group, weights=weights, minlength=n)
        return np.bincount(group[where], weights=weights[where], minlength=n)

    output, drafts, drafted, accepted = (
        np.asarray(columns[c], dtype=float)
        for c in ("output_tokens", "num_drafts", "num_draft_tokens", "num_accepted_tokens")
    )
    ttft, e2e, device_s = _floats(columns["ttft_s"]), _floats(columns["e2e_s"]), _floats(columns["device_s"])
    ok = np.array([s == "ok" for s in columns["status"]], dtype=bool)
    drafting = drafted > 0
    rate = np.divide(accepted, drafted, out=np.zeros_like(accepted), where=drafting)
    costed = ok & (output > 0) & ~np.isnan(device_s)
    rate_n, rate_sum = total(drafting.astype(float)), total(rate, drafting)
    mean = np.divide(rate_sum, rate_n, out=np.zeros(n), where=rate_n > 0)
    deviation = rate - mean[group]
    out = {
        "requests": np.bincount(group, minlength=n).astype(float),
        "errors": total(np.array([s == "error" for s in columns["status"]], dtype=float)),
        "ooms": total(np.array([bool(e) and "oom" in e for e in columns["error"]], dtype=float)),
        "output_tokens": total(output),
        "drafts": total(drafts),
        "draft_tokens": total(drafted),
        "accepted_tokens": total(accepted),
        "rate_n": rate_n,
        "cost_requests": total(costed.astype(float)),
        "cost_output_tokens": total(output, costed),
        "rate_sum": rate_sum,
        "cost_device_s": total(np.nan_to_num(device_s), costed),
        "rate_m2": total(deviation * deviation, drafting),
    }
    out |= _span(np.asarray(columns["started_at"], dtype=float), e2e, group, n)
    for name, values in latencies(ttft, e2e, output).items():
        out[f"{name}_sketch"] = sketches_per_group(group, values, n)
    return out


def latencies(ttft: np.ndarray, e2e: np.ndarray, output: np.ndarray) -> dict[str, np.ndarray]:
    """Per request: what the sketches hold (NaN: none), TPOT = (e2e - ttft) / (output - 1) of
    requests with a TTFT and more than one output token."""
    has_tpot = (output > 1) & ~np.isnan(ttft)
    tpot = np.full(len(output), np.nan)
    tpot[has_tpot] = (e2e[has_tpot] - ttft[has_tpot]) / (output[has_tpot] - 1)
    return {"ttft": ttft, "e2e": e2e, "tpot": tpot}


def _span(started: np.ndarray, e2e: np.ndarray, group: np.ndarray, n: int) -> dict[str, np.ndarray]:
    """Per group: the time its work took, from the first request's start to the last one's finish
    (start + e2e): what rates divide by, so tokens made after the last start get their time."""
    first, last = np.full(n, np.inf), np.full(n, -np.inf)
    np.minimum.at(first, group, started)
    np.maximum.at(last, group, started + np.nan_to_num(e2e))
    return {"first_s": first, "last_s": last}


def sketches_per_group(group: np.ndarray, values: np.ndarray, n: int) -> list[sketch.Bins]:
    """One sketch per group (rows sorted by group once, then cut)."""
    order = np.argsort(group, kind="stable")
    bounds = np.searchsorted(group[order], np.arange(n + 1))
    ordered = values[order]
    return [sketch.from_values(ordered[bounds[i] : bounds[i + 1]]) for i in range(n)]


def stored_rows(keys: list[tuple], totals: dict) -> list[tuple]:
    """Per-second aggregates (`aggregate(..., LABELS, per_second=True)`) -> rows in STORED_COLUMNS order."""
    ints = np.rint(np.column_stack([totals[c] for c in COUNTS])).astype(np.int64).tolist()
    floats = np.column_stack([totals[c] for c in (*SUMS, "rate_m2", "first_s", "last_s")]).tolist()
    blobs = zip(*(map(sketch.encode, totals[c]) for c in SKETCHES))
    return [tuple(k) + tuple(i) + tuple(f) + tuple(b) for k, i, f, b in zip(keys, ints, floats, blobs)]


def insert_rows(cursor, rows: list[tuple], sqlite: bool) -> None:
    """Insert stored rows through a DB-API cursor (the ingest transaction's)."""
    if not rows:
        return
    mark = "?" if sqlite else "%s"
    sql = (
        f"INSERT INTO {WindowAggregate.__tablename__} ({', '.join(STORED_COLUMNS)}) "
        f"VALUES ({', '.join([mark] * len(STORED_COLUMNS))})"
    )
    cursor.executemany(sql, rows)


def write_for_records(cursor, records: Sequence[Any], sqlite: bool) -> int:
    """Aggregate newly stored request records and insert the rows; returns the rows written."""
    if not records:
        return 0
    keys, totals = aggregate(columns_of_records(records), LABELS, per_second=True)
    rows = stored_rows(keys, totals)
    insert_rows(cursor, rows, sqlite)
    return len(rows)


def covered_from(conn: Connection) -> float:
    """The first second from which every stored request is aggregated (inf: none is)."""
    value = conn.scalar(
        MaintenanceState.__table__.select()
        .with_only_columns(MaintenanceState.value)
        .where(MaintenanceState.key == COVERED_FROM)
    )
    return math.inf if value is None else float(value)


def apply_retention(conn: Connection, cutoff: float) -> int:
    """Delete aggregates of seconds before `cutoff` and move the coverage start past them."""
    first_kept = math.floor(cutoff / PERIOD_S) * PERIOD_S
    deleted = conn.execute(delete(WindowAggregate).where(WindowAggregate.period_start < first_kept)).rowcount
    start = covered_from(conn)
    if start < first_kept:
        conn.execute(delete(MaintenanceState).where(MaintenanceState.key == COVERED_FROM))
        conn.execute(MaintenanceState.__table__.insert().values(key=COVERED_FROM, value=float(first_kept)))
    return deleted
