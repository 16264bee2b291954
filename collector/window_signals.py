"""Window signals from the per-second aggregates (`collector.aggregates`), plus raw rows where
the aggregates do not cover the window.

A window [start, end) is cut in three: the whole seconds from max(ceil(start), the coverage
start) to floor(end) come from the stored aggregates; the rest (the partial seconds at both ends,
and anything before the coverage start, e.g. requests stored before migration 0009) from raw
rows, aggregated by the same code as at ingest, so all parts simply merge. Counts, sums and
acceptance figures equal the raw-row ones (sums in another order: the last bits of a float may
differ); percentiles come from merged DDSketches, within 1% of the value at their rank
(`collector.sketch`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from sqlalchemy import Connection, Engine, and_, select

from collector import aggregates, sketch
from collector.aggregates import COUNTS, SUMS, WindowAggregate
from collector.models import Request
from collector.queries import Filters, Percentiles, Signals, Window

RAW_COLUMNS = tuple(getattr(Request, name) for name in aggregates.SOURCE_FIELDS)
ALL_SKETCHES = ("ttft", "e2e", "tpot")


@dataclass(frozen=True)
class Totals:
    """One label set's aggregates over a window."""

    sums: dict[str, float]  # COUNTS and SUMS by name
    rate_m2: float
    sketches: dict[str, sketch.Bins]  # by "ttft", "e2e", "tpot" (those asked for)

    def acceptance_mean(self) -> float | None:
        n = self.sums["rate_n"]
        return self.sums["rate_sum"] / n if n else None

    def acceptance_stddev(self) -> float | None:
        """Population standard deviation (numpy's np.std) of the per-request acceptance rates."""
        n = self.sums["rate_n"]
        return math.sqrt(max(0.0, self.rate_m2 / n)) if n else None


@dataclass
class _Part:
    """Partial aggregates: one entry per (label key, piece), several pieces per key."""

    keys: list[tuple]
    columns: dict[str, np.ndarray]  # COUNTS, SUMS, rate_m2
    sketches: dict[str, list[sketch.Bins]]


def window_totals(
    engine: Engine,
    window: Window,
    group_by: Sequence[str],
    filters: Filters = Filters(),
    with_sketches: Sequence[str] = ALL_SKETCHES,
) -> dict[tuple, Totals]:
    """Aggregates per label set (values of `group_by`, a subset of `aggregates.LABELS`)."""
    if filters.tags:
        raise ValueError("aggregates carry no tags: read raw rows for tag filters")
    with engine.connect() as conn:
        first = max(math.ceil(window.start), aggregates.covered_from(conn))
        last = math.floor(window.end)
        spans = [(window.start, window.end)]
        parts = []
        if last > first:
            parts.append(_stored(conn, first, last, group_by, filters, with_sketches))
            spans = [(window.start, first), (last, window.end)]
        parts.extend(_raw(conn, Window(lo, hi), group_by, filters, with_sketches) for lo, hi in spans if hi > lo)
    return _combine(parts, with_sketches)


def _label_conditions(filters: Filters) -> list:
    cond = [
        getattr(WindowAggregate, c) == getattr(filters, c)
        for c in ("instance", "model", "mode", "arm")
        if getattr(filters, c) is not None
    ]
    if filters.drafter is not None:
        drafter = WindowAggregate.drafter
        cond.append(drafter.is_(None) if filters.drafter == "none" else drafter == filters.drafter)
    return cond


def _stored(conn: Connection, first: int, last: int, group_by, filters: Filters, with_sketches) -> _Part:
    numeric = (*COUNTS, *SUMS, "rate_m2")
    blobs = tuple(f"{name}_sketch" for name in with_sketches)
    stmt = select(*(getattr(WindowAggregate, c) for c in (*group_by, *numeric, *blobs))).where(
        and_(WindowAggregate.period_start >= first, WindowAggregate.period_start < last, *_label_conditions(filters))
    )
    rows = conn.execute(stmt).all()
    k = len(group_by)
    columns = list(zip(*rows)) if rows else [()] * (k + len(numeric) + len(blobs))
    values = {name: np.array(columns[k + i], dtype=float) for i, name in enumerate(numeric)}
    sketches = {name: [sketch.decode(b) for b in columns[k + len(numeric) + i]] for i, name in enumerate(with_sketches)}
    return _Part([tuple(row[:k]) for row in rows], values, sketches)


def _raw(conn: Connection, window: Window, group_by, filters: Filters, with_sketches) -> _Part:
    rows = conn.execute(filters.apply(select(*RAW_COLUMNS), window)).all()
    if not rows:
        return _Part([], {}, {})
    keys, totals = aggregates.aggregate(
        aggregates.columns_of_rows(rows, aggregates.SOURCE_FIELDS), group_by, per_second=False
    )
    columns = {name: np.asarray(totals[name], dtype=float) for name in (*COUNTS, *SUMS, "rate_m2")}
    return _Part(keys, columns, {name: totals[f"{name}_sketch"] for name in with_sketches})


def _combine(parts: list[_Part], with_sketches) -> dict[tuple, Totals]:
    parts = [p for p in parts if p.keys]
    if not parts:
        return {}
    keys, group = aggregates.group_index([k for p in parts for k in p.keys])
    n = len(keys)
    column = {name: np.concatenate([p.columns[name] for p in parts]) for name in parts[0].columns}
    sums = {name: np.bincount(group, weights=column[name], minlength=n) for name in (*COUNTS, *SUMS)}
    m2 = _chan_m2(group, n, column["rate_n"], column["rate_sum"], column["rate_m2"], sums)
    merged = {name: _merge_per_group(group, n, [s for p in parts for s in p.sketches[name]]) for name in with_sketches}
    return {
        key: Totals(
            {name: float(sums[name][i]) for name in sums},
            float(m2[i]),
            {name: merged[name][i] for name in with_sketches},
        )
        for i, key in enumerate(keys)
    }


def _chan_m2(group, n: int, rate_n, rate_sum, rate_m2, sums) -> np.ndarray:
    """Sum of squared deviations of the merged pieces: sum of M2 + n_i (mean_i - mean)^2 (Chan et al.)."""
    total_n = sums["rate_n"]
    mean = np.divide(sums["rate_sum"], total_n, out=np.zeros(n), where=total_n > 0)
    piece_mean = np.divide(rate_sum, rate_n, out=np.zeros_like(rate_sum), where=rate_n > 0)
    spread = rate_n * (piece_mean - mean[group]) ** 2
    return np.bincount(group, weights=rate_m2 + spread, minlength=n)


def _merge_per_group(group: np.ndarray, n: int, pieces: list[sketch.Bins]) -> list[sketch.Bins]:
    by_group: list[list[sketch.Bins]] = [[] for _ in range(n)]
    for g, piece in zip(group.tolist(), pieces):
        by_group[g].append(piece)
    return [sketch.merge(p) for p in by_group]


def percentiles(bins: sketch.Bins) -> Percentiles:
    if not bins.count:
        return Percentiles()
    p50, p90, p95, p99 = (sketch.quantile(bins, q) for q in (0.5, 0.9, 0.95, 0.99))
    return Percentiles(p50, p90, p95, p99, bins.count)


def signals(engine: Engine, window: Window, filters: Filters = Filters()) -> Signals:
    """`collector.queries.signals` from the aggregates (percentiles from sketches)."""
    totals = window_totals(engine, window, (), filters).get(())
    if totals is None:
        totals = Totals({name: 0.0 for name in (*COUNTS, *SUMS)}, 0.0, dict.fromkeys(ALL_SKETCHES, sketch.EMPTY))
    s = totals.sums
    return Signals(
        window=window,
        requests=int(s["requests"]),
        errors=int(s["errors"]),
        ooms=int(s["ooms"]),
        requests_per_s=s["requests"] / window.seconds,
        output_tokens_per_s=s["output_tokens"] / window.seconds,
        drafts=int(s["drafts"]),
        draft_tokens=int(s["draft_tokens"]),
        accepted_tokens=int(s["accepted_tokens"]),
        acceptance_rate=s["accepted_tokens"] / s["draft_tokens"] if s["draft_tokens"] else None,
        acceptance_rate_mean=totals.acceptance_mean(),
        acceptance_rate_stddev=totals.acceptance_stddev(),
        mean_acceptance_length=1.0 + s["accepted_tokens"] / s["drafts"] if s["drafts"] else None,
        ttft=percentiles(totals.sketches["ttft"]),
        e2e=percentiles(totals.sketches["e2e"]),
        tpot=percentiles(totals.sketches["tpot"]),
    )
