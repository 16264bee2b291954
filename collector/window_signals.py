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
from sqlalchemy import Connection, Engine, and_, case, func, select

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
    return WindowReader(engine, window.end, filters).totals(window.start, group_by, with_sketches)


class WindowReader:
    """Totals of windows that all end at `end`, each piece of the store read once however many
    windows and groupings ask for it (an alert cycle: several signals, windows and group-bys at
    one instant).

    Pieces are kept per full label set (`aggregates.LABELS`) and merged to any group-by at the
    end: per segment of whole seconds, the stored aggregates' counts and sums (summed per label
    set by the database, M2 merged there with Chan's formula) and, only when a signal asks for
    them, sketch columns (blobs merged with numpy). Segments are cut at the windows' first whole
    seconds, so a wider window reads only the seconds before those already read. Per span: the
    raw rows of a partial second or of a part before the coverage start; the right end's partial
    second is one span for every window. A piece is what the store held when it was first read:
    use a new reader to see later writes.
    """

    def __init__(self, engine: Engine, end: float, filters: Filters = Filters()) -> None:
        if filters.tags:
            raise ValueError("aggregates carry no tags: read raw rows for tag filters")
        self.engine, self.end, self.filters = engine, end, filters
        self._covered_from: float | None = None
        self._sums: dict[int, _Part] = {}  # by segment start (a window's first whole second)
        self._segment_end: dict[int, int] = {}  # by segment start
        self._sketches: dict[tuple[int, str], dict[tuple, sketch.Bins]] = {}  # by (segment start, name)
        self._raw: dict[tuple[float, float], _Part] = {}  # by span

    def totals(
        self, start: float, group_by: Sequence[str], with_sketches: Sequence[str] = ALL_SKETCHES
    ) -> dict[tuple, Totals]:
        """Aggregates of [start, end) per label set of `group_by`."""
        with self.engine.connect() as conn:
            if self._covered_from is None:
                self._covered_from = aggregates.covered_from(conn)
            first, last = max(math.ceil(start), self._covered_from), math.floor(self.end)
            spans = [(start, self.end)]
            parts = []
            if last > first:
                parts.extend(self._stored(conn, first, last, with_sketches))
                spans = [(start, first), (last, self.end)]
            parts.extend(self._raw_part(conn, lo, hi) for lo, hi in spans if hi > lo)
        return _combine([_projected(part, group_by) for part in parts], with_sketches)

    def _stored(self, conn: Connection, first: int, last: int, with_sketches: Sequence[str]) -> list[_Part]:
        """The stored aggregates of [first, last) as the parts of consecutive segments."""
        parts = []
        for segment in self._segments(conn, first, last):
            sums = self._sums[segment]
            missing = [name for name in with_sketches if (segment, name) not in self._sketches]
            if missing:
                read = _stored_sketches(conn, segment, self._segment_end[segment], self.filters, missing)
                self._sketches.update({(segment, name): merged for name, merged in read.items()})
            sketches = {
                name: [self._sketches[segment, name].get(k, sketch.EMPTY) for k in sums.keys] for name in with_sketches
            }
            parts.append(_Part(sums.keys, sums.columns, sketches))
        return parts

    def _segments(self, conn: Connection, first: int, last: int) -> list[int]:
        """Starts of the segments that tile [first, last): those read before, and new ones read up to
        the next known start (a wider window reads only the seconds before the narrower ones)."""
        starts, cursor = [], first
        while cursor < last:
            if cursor not in self._sums:
                end = min((s for s in self._sums if s > cursor), default=last)
                self._sums[cursor], self._segment_end[cursor] = _stored_sums(conn, cursor, end, self.filters), end
            starts.append(cursor)
            cursor = self._segment_end[cursor]
        return starts

    def _raw_part(self, conn: Connection, lo: float, hi: float) -> _Part:
        if (lo, hi) not in self._raw:
            self._raw[lo, hi] = _raw(conn, Window(lo, hi), self.filters)
        return self._raw[lo, hi]


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


def _stored_where(first: int, last: int, filters: Filters):
    period = WindowAggregate.period_start
    return and_(period >= first, period < last, *_label_conditions(filters))


def _stored_sums(conn: Connection, first: int, last: int, filters: Filters) -> _Part:
    """COUNTS, SUMS and the merged rate_m2 of the stored rows of [first, last), one row per label set,
    summed by the database: M2 = the rows' M2 + rate_n (row mean - label set's mean)^2 (Chan et al.)."""
    agg, where = WindowAggregate, _stored_where(first, last, filters)
    labels = [getattr(agg, c) for c in aggregates.LABELS]
    set_mean = func.sum(agg.rate_sum) / func.nullif(func.sum(agg.rate_n), 0)
    means = select(*labels, set_mean.label("set_mean")).where(where).group_by(*labels).subquery()
    same_set = and_(*(getattr(agg, c).is_not_distinct_from(means.c[c]) for c in aggregates.LABELS))
    deviation = agg.rate_sum / agg.rate_n - means.c.set_mean
    spread = case((agg.rate_n > 0, agg.rate_n * deviation * deviation), else_=0.0)
    totals = [func.sum(getattr(agg, c)) for c in (*COUNTS, *SUMS)] + [func.sum(agg.rate_m2 + spread)]
    stmt = select(*labels, *totals).select_from(agg).join(means, same_set).where(where).group_by(*labels)
    rows = conn.execute(stmt).all()
    k = len(labels)
    values = list(zip(*rows)) if rows else [()] * (k + len(totals))
    numeric = (*COUNTS, *SUMS, "rate_m2")
    return _Part(
        [tuple(row[:k]) for row in rows],
        {name: np.array(values[k + i], dtype=float) for i, name in enumerate(numeric)},
        {},
    )


def _stored_sketches(
    conn: Connection, first: int, last: int, filters: Filters, names: Sequence[str]
) -> dict[str, dict[tuple, sketch.Bins]]:
    """The merged sketches `names` of the stored rows of [first, last), per name and label set."""
    labels = [getattr(WindowAggregate, c) for c in aggregates.LABELS]
    blobs = [getattr(WindowAggregate, f"{name}_sketch") for name in names]
    rows = conn.execute(select(*labels, *blobs).where(_stored_where(first, last, filters))).all()
    k = len(labels)
    keys, group = aggregates.group_index([tuple(row[:k]) for row in rows])
    return {
        name: dict(zip(keys, sketch.merge_encoded([row[k + i] for row in rows], group, len(keys))))
        for i, name in enumerate(names)
    }


def _raw(conn: Connection, window: Window, filters: Filters) -> _Part:
    """Raw rows of `window` aggregated per full label set, with every sketch."""
    rows = conn.execute(filters.apply(select(*RAW_COLUMNS), window)).all()
    if not rows:
        return _Part([], {}, {})
    keys, totals = aggregates.aggregate(
        aggregates.columns_of_rows(rows, aggregates.SOURCE_FIELDS), aggregates.LABELS, per_second=False
    )
    columns = {name: np.asarray(totals[name], dtype=float) for name in (*COUNTS, *SUMS, "rate_m2")}
    return _Part(keys, columns, {name: totals[f"{name}_sketch"] for name in ALL_SKETCHES})


def _projected(part: _Part, group_by: Sequence[str]) -> _Part:
    """A part keyed by the full label set, keyed by `group_by` instead (pieces not yet merged)."""
    positions = [aggregates.LABELS.index(name) for name in group_by]
    return _Part([tuple(key[i] for i in positions) for key in part.keys], part.columns, part.sketches)


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
