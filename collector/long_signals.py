"""Window signals for long windows (days, a month) from the rollups.

The window is cut in three: raw rows before the first whole minute, per-minute rollups up to
the last roll-up pass (less `history.GRACE_S`; whole hours from the hourly ones) plus the raw
rows of that span not rolled up yet (ids above the roll-up's last id: late arrivals), raw rows
after. The raw parts are aggregated exactly like the rollups (`rollups.aggregate`) so all three
simply add up. Percentiles come from the summed latency histograms (PromQL's
`histogram_quantile`, on the bounds every summed row has: `rollups.histogram_of`), the
acceptance mean and standard deviation across requests from the sums of rates and of their
squares. TPOT is not kept in rollups (left empty).
"""

from __future__ import annotations

import math

import numpy as np
from sqlalchemy import Engine, and_, func, select

from collector import rollups, window_signals
from collector.history import GRACE_S, RAW_WINDOW_LIMIT_S, histogram_quantile, rollup_conditions
from collector.models import Request, RequestRollup, RequestRollupHourly
from collector.queries import Filters, Percentiles, Signals, Window, signals

_COLUMNS = (
    *rollups.INT_COLUMNS,
    *rollups.FLOAT_COLUMNS,
    "legacy_rows",
)  # the last: rollup rows older than migration 0005


def auto_signals(engine: Engine, window: Window, filters: Filters = Filters()) -> Signals:
    """Raw rows for tag filters (the aggregates carry no tags); else up to RAW_WINDOW_LIMIT_S the
    per-second window aggregates (`collector.window_signals`), rollups beyond."""
    if filters.tags:
        return signals(engine, window, filters)
    if window.seconds <= RAW_WINDOW_LIMIT_S:
        return window_signals.signals(engine, window, filters)
    return long_signals(engine, window, filters)


def long_signals(engine: Engine, window: Window, filters: Filters = Filters()) -> Signals:
    first = min(window.end, math.ceil(window.start / 60) * 60)
    with engine.connect() as conn:
        pass_at, last_id = rollups.get_state(conn, rollups.LAST_PASS_AT), rollups.get_state(conn, rollups.LAST_ID) or 0
        split = first if pass_at is None else min(window.end, max(first, math.floor((pass_at - GRACE_S) / 60) * 60))
        totals = _raw_totals(conn, window.start, first, filters) + _raw_totals(conn, split, window.end, filters)
        if split > first:
            totals += _raw_totals(conn, first, split, filters, after_id=last_id)
            totals += _rollup_totals(conn, first, split, filters)
    return _signals_from(window, {c: float(v) for c, v in zip(_COLUMNS, totals)})


def _rollup_totals(conn, start: float, end: float, filters: Filters) -> np.ndarray:
    """Sums over [start, end): whole hours from the hourly rollups, the edges from the per-minute ones."""
    h0, h1 = math.ceil(start / 3600) * 3600, math.floor(end / 3600) * 3600
    spans = (
        [(RequestRollupHourly, h0, h1), (RequestRollup, start, h0), (RequestRollup, h1, end)]
        if h1 > h0
        else [(RequestRollup, start, end)]
    )
    totals = np.zeros(len(_COLUMNS))
    for table, lo, hi in spans:
        if hi > lo:
            sums = [func.coalesce(func.sum(getattr(table, c)), 0) for c in _COLUMNS[:-1]]
            stmt = select(*sums, rollups.legacy_rows(table))
            totals += np.array(
                conn.execute(stmt.where(and_(*rollup_conditions(table, lo, hi, filters)))).one(), dtype=float
            )
    return totals


def _raw_totals(conn, start: float, end: float, filters: Filters, after_id: float | None = None) -> np.ndarray:
    if end <= start:
        return np.zeros(len(_COLUMNS))
    stmt = filters.apply(select(*rollups.RAW_COLUMNS), Window(start, end), time_index=after_id is None)
    if after_id is not None:  # few rows past the roll-up's last id: find them by id, not by time
        stmt = stmt.where(Request.id > after_id)
    rows = conn.execute(stmt).all()
    if not rows:
        return np.zeros(len(_COLUMNS))
    _, ints, floats = rollups.aggregate(rows, 60)
    return np.concatenate([ints.sum(axis=0), floats.sum(axis=0), [0]]).astype(float)


def _signals_from(window: Window, t: dict[str, float]) -> Signals:
    n_rate = t["rate_n"]
    mean = t["rate_sum"] / n_rate if n_rate else None
    stddev = math.sqrt(max(0.0, t["rate_sumsq"] / n_rate - mean * mean)) if n_rate else None
    return Signals(
        window=window,
        requests=int(t["requests"]),
        errors=int(t["errors"]),
        ooms=int(t["ooms"]),
        requests_per_s=t["requests"] / window.seconds,
        output_tokens_per_s=t["output_tokens"] / window.seconds,
        drafts=int(t["drafts"]),
        draft_tokens=int(t["draft_tokens"]),
        accepted_tokens=int(t["accepted_tokens"]),
        acceptance_rate=t["accepted_tokens"] / t["draft_tokens"] if t["draft_tokens"] else None,
        acceptance_rate_mean=mean,
        acceptance_rate_stddev=stddev,
        mean_acceptance_length=1.0 + t["accepted_tokens"] / t["drafts"] if t["drafts"] else None,
        ttft=_percentiles(np.array([t[c] for c in rollups.TTFT_COLUMNS]), t["legacy_rows"]),
        e2e=_percentiles(np.array([t[c] for c in rollups.E2E_COLUMNS]), t["legacy_rows"]),
        tpot=Percentiles(),
    )


def _percentiles(counts: np.ndarray, legacy: float) -> Percentiles:
    if not counts.sum():
        return Percentiles()
    p50, p90, p95, p99 = (histogram_quantile(q, *rollups.histogram_of(counts, legacy)) for q in (0.5, 0.9, 0.95, 0.99))
    return Percentiles(p50, p90, p95, p99, int(counts.sum()))
