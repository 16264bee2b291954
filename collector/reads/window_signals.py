"""Window signals from the per-second aggregates (`collector.tiers.aggregates`), plus raw rows where
the aggregates do not cover the window.

A window [start, end) is cut in three: the whole seconds from max(ceil(start), the coverage
start) to floor(end) come from the stored aggregates; the rest (the partial seconds at both ends,
and anything before the coverage start, e.g. requests stored before migration 0009) from raw
rows, aggregated by the same code as at ingest, so all parts simply merge. Counts, sums and
acceptance figures equal the raw-row ones (sums in another order: the last bits of a float may
differ); percentiles come from merged DDSketches, within 1% of the value at their rank
(`collector.tiers.sketch`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from sqlalchemy import Connection, Engine, and_, case, func, select

from specwatch.collector.models import Request
from specwatch.collector.reads.queries import Filters, Signals, Window
from specwatch.collector.tiers import aggregates, sketch
from specwatch.collector.tiers.aggregates import COUNTS, SUMS, WindowAggregate
from specwatch.collector.tiers.totals import EMPTY, SKETCH_NAMES, Totals, percentiles, signals_from

RAW_COLUMNS = tuple(getattr(Request, name) for name in aggregates.SOURCE_FIELDS)
ALL_SKETCHES = SKETCH_NAMES
NUMERIC = (*COUNTS, *SUMS, "rate_m2", "first_s", "last_s")  # a part's columns
Step = tuple[float, float]  # (origin, step seconds): a leading key, the step index of each second
__all__ = ["Totals", "WindowReader", "percentiles", "signals", "window_totals", "stepped_totals"]


@dataclass
class _Part:
    """Partial aggregates: one entry per (label key, piece), several pieces per key."""

    keys: list[tuple]
    columns: dict[str, np.ndarray]  # NUMERIC
    sketches: dict[str, list[sketch.Bins]]


def window_totals(
    db: Engine,
    window: Window,
    group_by: Sequence[str],
    filters: Filters = Filters(),
    with_sketches: Sequence[str] = ALL_SKETCHES,
) -> dict[tuple, Totals]:
    """Aggregates per label set (values of `group_by`, a subset of `aggregates.LABELS`)."""
    return WindowReader(db, window.end, filters).totals(window.start, group_by, with_sketches)


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

    def __init__(self, db: Engine, end: float, filters: Filters = Filters()) -> None:
        if filters.tags:
            raise ValueError("aggregates carry no tags: read raw rows for tag filters")
        self.db, self.end, self.filters = db, end, filters
        self._covered_from: float | None = None
        self._sums: dict[int, _Part] = {}  # by segment start (a window's first whole second)
        self._segment_end: dict[int, int] = {}  # by segment start
        self._sketches: dict[tuple[int, str], dict[tuple, sketch.Bins]] = {}  # by (segment start, name)
        self._raw: dict[tuple[float, float], _Part] = {}  # by span
        self.memo: dict[tuple, object] = {}  # other reads of this instant, made once per reader (by their key)

    def totals(
        self, start: float, group_by: Sequence[str], with_sketches: Sequence[str] = ALL_SKETCHES
    ) -> dict[tuple, Totals]:
        """Aggregates of [start, end) per label set of `group_by`."""
        with self.db.connect() as conn:
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


def _key_columns(step: Step | None) -> list:
    """The stored rows' key: the label set, after the step index of the row's second when stepping."""
    labels = [getattr(WindowAggregate, c).label(c) for c in aggregates.LABELS]
    if step is None:
        return labels
    origin, step_s = step
    return [func.floor((WindowAggregate.period_start - origin) / step_s).label("step"), *labels]


def _stored_sums(conn: Connection, first: int, last: int, filters: Filters, step: Step | None = None) -> _Part:
    """NUMERIC of the stored rows of [first, last), one row per key (`_key_columns`), summed by the
    database: M2 = the rows' M2 + rate_n (row mean - key's mean)^2 (Chan et al.)."""
    agg, where, keys = WindowAggregate, _stored_where(first, last, filters), _key_columns(step)
    set_mean = func.sum(agg.rate_sum) / func.nullif(func.sum(agg.rate_n), 0)
    means = select(*keys, set_mean.label("set_mean")).where(where).group_by(*keys).subquery()
    same_key = and_(*(key.element.is_not_distinct_from(means.c[key.name]) for key in keys))
    deviation = agg.rate_sum / agg.rate_n - means.c.set_mean
    spread = case((agg.rate_n > 0, agg.rate_n * deviation * deviation), else_=0.0)
    totals = [func.sum(getattr(agg, c)) for c in (*COUNTS, *SUMS)] + [func.sum(agg.rate_m2 + spread)]
    # rows from before migration 0017 have no span of their own: their second's
    span = [
        func.min(func.coalesce(agg.first_start_s, agg.period_start)),
        func.max(func.coalesce(agg.last_end_s, agg.period_start + aggregates.PERIOD_S)),
    ]
    stmt = select(*keys, *totals, *span).select_from(agg).join(means, same_key).where(where).group_by(*keys)
    rows = conn.execute(stmt).all()
    k = len(keys)
    values = list(zip(*rows)) if rows else [()] * (k + len(NUMERIC))
    return _Part(
        [_key(row[:k], step) for row in rows],
        {name: np.array(values[k + i], dtype=float) for i, name in enumerate(NUMERIC)},
        {},
    )


def _key(values: Sequence, step: Step | None) -> tuple:
    return tuple(values) if step is None else (int(values[0]), *values[1:])


def _stored_sketches(
    conn: Connection, first: int, last: int, filters: Filters, names: Sequence[str], step: Step | None = None
) -> dict[str, dict[tuple, sketch.Bins]]:
    """The merged sketches `names` of the stored rows of [first, last), per name and key."""
    keys, blobs = _key_columns(step), [getattr(WindowAggregate, f"{name}_sketch") for name in names]
    rows = conn.execute(select(*keys, *blobs).where(_stored_where(first, last, filters))).all()
    k = len(keys)
    found, group = aggregates.group_index([_key(row[:k], step) for row in rows])
    return {
        name: dict(zip(found, sketch.merge_encoded([row[k + i] for row in rows], group, len(found))))
        for i, name in enumerate(names)
    }


def _raw(conn: Connection, window: Window, filters: Filters, step: Step | None = None) -> _Part:
    """Raw rows of `window` aggregated per full label set (after the step index when stepping),
    with every sketch: by the code that writes the stored aggregates at ingest."""
    rows = conn.execute(filters.apply(select(*RAW_COLUMNS), window)).all()
    if not rows:
        return _Part([], {}, {})
    columns = aggregates.columns_of_rows(rows, aggregates.SOURCE_FIELDS)
    if step is not None:  # the step as a label: each second's index, as for the stored rows
        origin, step_s = step
        columns["step"] = np.floor((np.floor(np.asarray(columns["started_at"])) - origin) / step_s).astype(int).tolist()
    names = aggregates.LABELS if step is None else ("step", *aggregates.LABELS)
    keys, totals = aggregates.aggregate(columns, names, per_second=False)
    columns = {name: np.asarray(totals[name], dtype=float) for name in NUMERIC}
    return _Part(keys, columns, {name: totals[f"{name}_sketch"] for name in ALL_SKETCHES})


def stepped_totals(
    db: Engine,
    window: Window,
    step_s: float,
    group_by: Sequence[str] = (),
    filters: Filters = Filters(),
    with_sketches: Sequence[str] = ALL_SKETCHES,
    origin: float | None = None,
) -> dict[tuple, Totals]:
    """Totals per (step index, values of `group_by`) over `window` cut in steps of `step_s` from
    `origin` (default: its start): the stored aggregates of its whole covered seconds, raw rows for
    the rest. A request counts in the step its second starts in (steps are cut at whole seconds)."""
    if filters.tags:
        raise ValueError("aggregates carry no tags: read raw rows for tag filters")
    step = (window.start if origin is None else origin, step_s)
    with db.connect() as conn:
        first, last = max(math.ceil(window.start), aggregates.covered_from(conn)), math.floor(window.end)
        spans, parts = [(window.start, window.end)], []
        if last > first:
            sums = _stored_sums(conn, first, last, filters, step)
            found = _stored_sketches(conn, first, last, filters, with_sketches, step)
            sketches = {name: [found[name].get(k, sketch.EMPTY) for k in sums.keys] for name in with_sketches}
            parts.append(_Part(sums.keys, sums.columns, sketches))
            spans = [(window.start, first), (last, window.end)]
        parts.extend(_raw(conn, Window(lo, hi), filters, step) for lo, hi in spans if hi > lo)
    return _combine([_projected(part, ("step", *group_by), stepped=True) for part in parts], with_sketches)


def _projected(part: _Part, group_by: Sequence[str], stepped: bool = False) -> _Part:
    """A part keyed by the full label set (after the step when `stepped`), keyed by `group_by`
    instead (pieces not yet merged)."""
    names = ("step", *aggregates.LABELS) if stepped else aggregates.LABELS
    positions = [names.index(name) for name in group_by]
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
    first, last = np.full(n, np.inf), np.full(n, -np.inf)
    np.minimum.at(first, group, column["first_s"])
    np.maximum.at(last, group, column["last_s"])
    merged = {name: _merge_per_group(group, n, [s for p in parts for s in p.sketches[name]]) for name in with_sketches}
    return {
        key: Totals(
            {name: float(sums[name][i]) for name in sums},
            float(m2[i]),
            {name: merged[name][i] for name in with_sketches},
            float(first[i]),
            float(last[i]),
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


def signals(db: Engine, window: Window, filters: Filters = Filters()) -> Signals:
    """`collector.reads.queries.signals` from the aggregates (percentiles from sketches)."""
    return signals_from(window, window_totals(db, window, (), filters).get((), EMPTY))
