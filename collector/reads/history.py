"""Long windows from the rollups (plus raw rows for the part not rolled up yet).

Hour-aligned windows with whole-hour steps read the per-hour rollups, others the
per-minute ones.

Percentiles here come from the rollups' DDSketches of TTFT, e2e and TPOT (within 1% of the raw
rows', as in the per-second tier); a step that includes rollup rows written before migration 0011
(no sketches) interpolates TTFT and e2e in the histograms the way PromQL's `histogram_quantile` does
(on the bounds every summed row has: `rollups.histogram_of`) and has no TPOT.
Tag filters are not kept in rollups: a query with tags falls back to raw rows.
"""

from __future__ import annotations

import math

import numpy as np
from sqlalchemy import Engine, and_, func, select

from specwatch.collector.models import Request, RequestRollup, RequestRollupHourly
from specwatch.collector.reads.queries import Filters, HourOfDay, Window, errors_by_hour
from specwatch.collector.reads.series import SeriesPoint, rate_moments, series
from specwatch.collector.tiers import aggregates, sketch
from specwatch.collector.tiers.rollups import (
    E2E_COLUMNS,
    FLOAT_COLUMNS,
    INT_COLUMNS,
    LAST_ID,
    LAST_PASS_AT,
    RAW_COLUMNS,
    SKETCH_COLUMNS,
    TTFT_COLUMNS,
    aggregate,
    get_state,
    histogram_of,
    legacy_rows,
)
from specwatch.telemetry import ratios
from specwatch.telemetry.schema import LATENCY_BUCKETS

RAW_WINDOW_LIMIT_S = 6 * 3600.0
# Requests finish after they start: minutes this close to the last roll-up pass may still
# gain rows, so those steps are read from raw rows.
GRACE_S = 300.0
_SUMS = (
    "requests",
    "errors",
    "output_tokens",
    "drafts",
    "draft_tokens",
    "accepted_tokens",
    "rate_n",
    "rate_sum",
    "rate_m2",
    "sketched",
)
_NAMES = tuple(c.removesuffix("_sketch") for c in SKETCH_COLUMNS)  # ttft, e2e, tpot


def histogram_quantile(q: float, counts: np.ndarray, bounds=LATENCY_BUCKETS) -> float | None:
    """PromQL's histogram_quantile over non-cumulative bucket counts (last bucket: +Inf)."""
    total = counts.sum()
    if total == 0:
        return None
    cumulative = np.cumsum(counts)
    rank = q * total
    i = int(np.searchsorted(cumulative, rank, side="left"))
    if i >= len(bounds):
        return float(bounds[-1])  # in the +Inf bucket: the largest finite bound, as Prometheus does
    lower = 0.0 if i == 0 else bounds[i - 1]
    below = 0.0 if i == 0 else cumulative[i - 1]
    return float(lower + (bounds[i] - lower) * (rank - below) / counts[i])


def auto_series(db: Engine, window: Window, filters: Filters = Filters(), step_s: float = 60.0) -> list[SeriesPoint]:
    """Exact raw-row series for short windows, rollups for long ones."""
    if window.seconds <= RAW_WINDOW_LIMIT_S:
        return series(db, window, filters, step_s)
    return long_series(db, window, filters, step_s)


def long_series(db: Engine, window: Window, filters: Filters = Filters(), step_s: float = 3600.0) -> list[SeriesPoint]:
    """Steps ending before the last roll-up pass (less GRACE_S) come from rollups (plus raw rows the
    pass has not seen yet), the rest from raw rows."""
    if filters.tags or step_s % 60 or window.start % 60:
        return series(db, window, filters, step_s)
    with db.connect() as conn:
        pass_at = get_state(conn, LAST_PASS_AT)
    if pass_at is None:
        return series(db, window, filters, step_s)
    steps = math.ceil(window.seconds / step_s)
    rolled_steps = int(min(steps, max(0, (pass_at - GRACE_S - window.start) // step_s)))
    split = window.start + rolled_steps * step_s
    points = _rollup_points(db, window.start, rolled_steps, step_s, filters) if rolled_steps else []
    if split < window.end:
        points += series(db, Window(split, window.end), filters, step_s)
    return points


def rollup_conditions(table, start: float, end: float, filters: Filters) -> list:
    cond = [table.period_start >= start, table.period_start < end]
    for column in ("instance", "model", "mode"):
        if (value := getattr(filters, column)) is not None:
            cond.append(getattr(table, column) == value)
    for column in ("drafter", "arm"):
        if (value := getattr(filters, column)) is not None:
            cond.append(getattr(table, column) == ("" if value == "none" else value))
    return cond


def errors_by_hour_long(db: Engine, window: Window, filters: Filters = Filters()) -> list[HourOfDay]:
    """errors_by_hour from the hourly rollups for windows longer than RAW_WINDOW_LIMIT_S.

    Whole hours come from the rollups (up to the last roll-up pass), the rest from raw rows.
    """
    h0 = math.ceil(window.start / 3600) * 3600
    with db.connect() as conn:
        pass_at, last_id = get_state(conn, LAST_PASS_AT), int(get_state(conn, LAST_ID) or 0)
    h1 = min(math.floor(window.end / 3600), math.floor(((pass_at or 0) - GRACE_S) / 3600)) * 3600
    if window.seconds <= RAW_WINDOW_LIMIT_S or filters.tags or h1 <= h0:
        return errors_by_hour(db, window, filters)
    cols = [
        RequestRollupHourly.period_start,
        RequestRollupHourly.requests,
        RequestRollupHourly.errors,
        RequestRollupHourly.ooms,
    ]
    totals = np.zeros((24, 3), dtype=np.int64)
    with db.connect() as conn:
        for start, *counts in conn.execute(
            select(*cols).where(and_(*rollup_conditions(RequestRollupHourly, h0, h1, filters)))
        ):
            totals[int(start // 3600) % 24] += [int(c) for c in counts]
    parts = [(window.start, h0, None), (h1, window.end, None), (h0, h1, last_id)]  # last: rows not rolled up yet
    for lo, hi, after_id in parts:
        if hi > lo:
            for h in errors_by_hour(db, Window(lo, hi), filters, after_id):
                totals[h.hour] += (h.requests, h.errors, h.ooms)
    return [HourOfDay(h, *(int(x) for x in totals[h])) for h in range(24)]


def _rollup_points(db: Engine, start: float, steps: int, step_s: float, filters: Filters) -> list[SeriesPoint]:
    table = RequestRollupHourly if start % 3600 == 0 and step_s % 3600 == 0 else RequestRollup
    index = func.floor((table.period_start - start) / step_s).label("step")
    where = and_(*rollup_conditions(table, start, start + steps * step_s, filters))
    step_mean = func.sum(table.rate_sum) / func.nullif(func.sum(table.rate_n), 0)
    means = select(index, step_mean.label("mean")).where(where).group_by(index).subquery()
    sums = [
        aggregates.sql_merged_m2(table, means.c.mean) if c == "rate_m2" else func.sum(getattr(table, c))
        for c in (*_SUMS, *TTFT_COLUMNS, *E2E_COLUMNS)
    ] + [legacy_rows(table)]
    stmt = select(index, *sums).join(means, means.c.step == index).where(where).group_by(index)
    totals = np.zeros((steps, len(sums)))  # the last column: legacy rows (no raw row adds to it)
    with db.connect() as conn:
        for step, *values in conn.execute(stmt):
            totals[int(step)] = [float(v or 0) for v in values]
        sketches = _rollup_sketches(conn, table, index, start, steps, step_s, filters)
        _add_unrolled(conn, totals, sketches, start, step_s, filters)
    return [_point(start + i * step_s, totals[i], {n: found[i] for n, found in sketches.items()}) for i in range(steps)]


def _rollup_sketches(conn, table, index, start: float, steps: int, step_s: float, filters: Filters) -> dict:
    """Per sketch name, the merged sketch of each step's rollup rows."""
    blobs = [getattr(table, c) for c in SKETCH_COLUMNS]
    where = and_(*rollup_conditions(table, start, start + steps * step_s, filters))
    rows = conn.execute(select(index, *blobs).where(where)).all()
    group = np.array([int(row[0]) for row in rows], dtype=np.int64)
    return {name: sketch.merge_encoded([row[1 + i] for row in rows], group, steps) for i, name in enumerate(_NAMES)}


_COLUMN_INDEX = {c: i for i, c in enumerate((*_SUMS, *TTFT_COLUMNS, *E2E_COLUMNS))}


def _add_unrolled(conn, totals: np.ndarray, sketches: dict, start: float, step_s: float, filters: Filters) -> None:
    """Fold in raw rows of the rolled span that the last pass has not seen (late arrivals)."""
    last_id = get_state(conn, LAST_ID) or 0
    window = Window(start, start + len(totals) * step_s)
    rows = conn.execute(filters.apply(select(*RAW_COLUMNS), window, time_index=False).where(Request.id > last_id)).all()
    if not rows:
        return
    keys, ints, floats, late = aggregate(rows, 60)
    steps = np.array([int((key[0] - start) // step_s) for key in keys])
    late_moments = [
        ints[:, INT_COLUMNS.index("rate_n")],
        *(floats[:, FLOAT_COLUMNS.index(c)] for c in ("rate_sum", "rate_m2")),
    ]
    stored_moments = [totals[:, _COLUMN_INDEX[c]] for c in ("rate_n", "rate_sum", "rate_m2")]
    group = np.concatenate([np.arange(len(totals)), steps])
    merged_m2 = aggregates.merge_m2(group, len(totals), *(np.concatenate(p) for p in zip(stored_moments, late_moments)))
    for name, values in (*zip(INT_COLUMNS, ints.T), *zip(FLOAT_COLUMNS, floats.T)):
        if name in _COLUMN_INDEX and name != "rate_m2":
            np.add.at(totals[:, _COLUMN_INDEX[name]], steps, values)
    totals[:, _COLUMN_INDEX["rate_m2"]] = merged_m2
    for name, found in sketches.items():
        for step, piece in zip(steps.tolist(), late[name]):
            found[step] = sketch.merge([found[step], piece])


def _point(t: float, row: np.ndarray, sketches: dict[str, sketch.Bins]) -> SeriesPoint:
    requests, errors, out, drafts, drafted, accepted = (int(v) for v in row[:6])
    mean, stddev = (float(m[0]) for m in rate_moments(*(np.array([v]) for v in row[6:9])))
    return SeriesPoint(
        t=t,
        requests=requests,
        errors=errors,
        output_tokens=out,
        drafts=drafts,
        draft_tokens=drafted,
        accepted_tokens=accepted,
        acceptance_rate=ratios.acceptance_rate(accepted, drafted),
        acceptance_rate_mean=None if math.isnan(mean) else mean,
        acceptance_rate_stddev=None if math.isnan(stddev) else stddev,
        mean_acceptance_length=ratios.mean_acceptance_length(accepted, drafts),
        **_quantiles(row, sketches),
    )


def _quantiles(row: np.ndarray, sketches: dict[str, sketch.Bins]) -> dict[str, float | None]:
    """P50 and P99 of TTFT, e2e and TPOT from the step's sketches; TTFT and e2e from its histograms
    when it includes rows written before migration 0011 (fewer requests sketched than counted)."""
    if row[_SUMS.index("sketched")] >= row[0]:
        return {f"{name}_p{q}": sketch.quantile(sketches[name], q / 100) for name in _NAMES for q in (50, 99)}
    e2e_at = len(_SUMS) + len(TTFT_COLUMNS)
    ttft, e2e = histogram_of(row[len(_SUMS) : e2e_at], row[-1]), histogram_of(row[e2e_at:-1], row[-1])
    return {
        f"{name}_p{q}": histogram_quantile(q / 100, *h)
        for name, h in zip(("ttft", "e2e"), (ttft, e2e))
        for q in (50, 99)
    }
