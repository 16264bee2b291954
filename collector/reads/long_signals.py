"""Window signals for long windows (days, a month) from the rollups.

The window is cut in three: raw rows before the first whole minute, per-minute rollups up to
the last roll-up pass (less `history.GRACE_S`; whole hours from the hourly ones) plus the raw
rows of that span not rolled up yet (ids above the roll-up's last id: late arrivals), raw rows
after. The raw parts are aggregated exactly like the rollups (`rollups.aggregate`) so all three
simply add up: counts and sums, the acceptance mean and standard deviation across requests from
the sums of rates and of their squares, and the DDSketches of TTFT, e2e and TPOT (merged: the same
sketch type as the per-second tier, so percentiles are within 1% of the raw rows').

A window that includes rollup rows written before migration 0011 (no sketches: `sketched` <
`requests`) reads TTFT and e2e percentiles from the summed histograms instead (PromQL's
`histogram_quantile` on the bounds every summed row has: `rollups.histogram_of`), marked
`basis="histogram"`, and has no TPOT.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
from sqlalchemy import Engine, and_, func, select

from specwatch.collector.models import Request, RequestRollup, RequestRollupHourly
from specwatch.collector.reads import window_signals
from specwatch.collector.reads.history import GRACE_S, RAW_WINDOW_LIMIT_S, histogram_quantile, rollup_conditions
from specwatch.collector.reads.queries import Filters, Percentiles, Signals, Window, signals
from specwatch.collector.tiers import aggregates, rollups, sketch
from specwatch.collector.tiers.aggregates import COUNTS, SUMS
from specwatch.collector.tiers.totals import SKETCH_NAMES, Totals, signals_from

_COLUMNS = (
    *rollups.INT_COLUMNS,
    *rollups.FLOAT_COLUMNS,
    "legacy_rows",
)  # the last: rollup rows older than migration 0005


_INTS, _FLOATS = rollups.INT_COLUMNS, rollups.FLOAT_COLUMNS
_M2 = _COLUMNS.index("rate_m2")


def _merged_m2(rate_n, rate_sum, rate_m2) -> float:
    """The pieces' acceptance spreads merged into one (`aggregates.merge_m2`)."""
    return float(aggregates.merge_m2(np.zeros(len(rate_n), dtype=np.int64), 1, rate_n, rate_sum, rate_m2)[0])


def auto_signals(db: Engine, window: Window, filters: Filters = Filters()) -> Signals:
    """Raw rows for tag filters (the aggregates carry no tags); else up to RAW_WINDOW_LIMIT_S the
    per-second window aggregates (`collector.reads.window_signals`), rollups beyond."""
    if filters.tags:
        return signals(db, window, filters)
    if window.seconds <= RAW_WINDOW_LIMIT_S:
        return window_signals.signals(db, window, filters)
    return long_signals(db, window, filters)


@dataclasses.dataclass(frozen=True)
class Part:
    """Sums in _COLUMNS order, the span its requests started in, and its sketches by name."""

    sums: np.ndarray
    first_s: float = math.inf
    last_s: float = -math.inf
    sketches: dict[str, sketch.Bins] = dataclasses.field(default_factory=dict)


_NONE = Part(np.zeros(len(_COLUMNS)))


def long_signals(db: Engine, window: Window, filters: Filters = Filters()) -> Signals:
    first = min(window.end, math.ceil(window.start / 60) * 60)
    with db.connect() as conn:
        pass_at, last_id = rollups.get_state(conn, rollups.LAST_PASS_AT), rollups.get_state(conn, rollups.LAST_ID) or 0
        split = first if pass_at is None else min(window.end, max(first, math.floor((pass_at - GRACE_S) / 60) * 60))
        parts = [_raw_totals(conn, window.start, first, filters), _raw_totals(conn, split, window.end, filters)]
        if split > first:
            parts.append(_raw_totals(conn, first, split, filters, after_id=last_id))
            parts.extend(_rollup_totals(conn, first, split, filters))
    return _signals_from(window, parts)


def _rollup_totals(conn, start: float, end: float, filters: Filters) -> list[Part]:
    """Sums over [start, end): whole hours from the hourly rollups, the edges from the per-minute ones."""
    h0, h1 = math.ceil(start / 3600) * 3600, math.floor(end / 3600) * 3600
    spans = (
        [(RequestRollupHourly, h0, h1, 3600), (RequestRollup, start, h0, 60), (RequestRollup, h1, end, 60)]
        if h1 > h0
        else [(RequestRollup, start, end, 60)]
    )
    return [_rollup_part(conn, table, lo, hi, period_s, filters) for table, lo, hi, period_s in spans if hi > lo]


def _rollup_part(conn, table, lo: float, hi: float, period_s: int, filters: Filters) -> Part:
    where = and_(*rollup_conditions(table, lo, hi, filters))
    mean = select(func.sum(table.rate_sum) / func.nullif(func.sum(table.rate_n), 0)).where(where).scalar_subquery()
    sums = [
        func.coalesce(aggregates.sql_merged_m2(table, mean) if c == "rate_m2" else func.sum(getattr(table, c)), 0)
        for c in _COLUMNS[:-1]
    ]
    span = [func.min(table.period_start), func.max(table.period_start) + period_s]
    row = conn.execute(select(*sums, rollups.legacy_rows(table), *span).where(where)).one()
    if row[-2] is None:
        return _NONE
    blobs = conn.execute(select(*(getattr(table, c) for c in rollups.SKETCH_COLUMNS)).where(where)).all()
    merged = {
        name: sketch.merge_encoded([b[i] for b in blobs], np.zeros(len(blobs), dtype=np.int64), 1)[0]
        for i, name in enumerate(SKETCH_NAMES)
    }
    return Part(np.array(row[:-2], dtype=float), float(row[-2]), float(row[-1]), merged)


def _raw_totals(conn, start: float, end: float, filters: Filters, after_id: float | None = None) -> Part:
    if end <= start:
        return _NONE
    stmt = filters.apply(select(*rollups.RAW_COLUMNS), Window(start, end), time_index=after_id is None)
    if after_id is not None:  # few rows past the roll-up's last id: find them by id, not by time
        stmt = stmt.where(Request.id > after_id)
    rows = conn.execute(stmt).all()
    if not rows:
        return _NONE
    _, ints, floats, sketches = rollups.aggregate(rows, 60)
    started = [row[0] for row in rows]
    sums = np.concatenate([ints.sum(axis=0), floats.sum(axis=0), [0]]).astype(float)
    sums[_M2] = _merged_m2(
        ints[:, _INTS.index("rate_n")], floats[:, _FLOATS.index("rate_sum")], floats[:, _FLOATS.index("rate_m2")]
    )
    merged = {name: sketch.merge(sketches[name]) for name in SKETCH_NAMES}
    return Part(sums, math.floor(min(started)), math.floor(max(started)) + 1, merged)


def _signals_from(window: Window, parts: list[Part]) -> Signals:
    t = dict(zip(_COLUMNS, sum(p.sums for p in parts).tolist()))
    pieces = np.array([p.sums for p in parts])
    m2 = _merged_m2(*(pieces[:, _COLUMNS.index(c)] for c in ("rate_n", "rate_sum", "rate_m2")))
    sketches = {name: sketch.merge(p.sketches.get(name, sketch.EMPTY) for p in parts) for name in SKETCH_NAMES}
    first, last = min(p.first_s for p in parts), max(p.last_s for p in parts)
    totals = Totals({name: t.get(name, 0.0) for name in (*COUNTS, *SUMS)}, m2, sketches, first, last)
    found = signals_from(window, totals)
    if t["sketched"] >= t["requests"]:
        return found
    return dataclasses.replace(  # rollup rows from before migration 0011 in the sum: their histograms
        found,
        ttft=_histogram_percentiles(np.array([t[c] for c in rollups.TTFT_COLUMNS]), t["legacy_rows"]),
        e2e=_histogram_percentiles(np.array([t[c] for c in rollups.E2E_COLUMNS]), t["legacy_rows"]),
        tpot=Percentiles(basis="histogram"),
    )


def _histogram_percentiles(counts: np.ndarray, legacy: float) -> Percentiles:
    if not counts.sum():
        return Percentiles(basis="histogram")
    bins, bounds = rollups.histogram_of(counts, legacy)
    p50, p90, p95, p99 = (histogram_quantile(q, bins, bounds) for q in (0.5, 0.9, 0.95, 0.99))
    return Percentiles(p50, p90, p95, p99, int(counts.sum()), basis="histogram")
