"""The tiered read path: every window query the query API answers picks its tier here.

Tiers, by window and filters:
  * raw rows         a filter on tags (no aggregate carries tags): `collector.reads.queries`, `series`;
  * per-second aggregates (written at ingest, `collector.reads.window_signals`; raw rows for the partial
    seconds at the ends and for seconds stored before migration 0009), windows up to
    `history.RAW_WINDOW_LIMIT_S`, and grouped totals (labels, compare, breakdown) of any window;
  * rollups (per minute, whole hours from the hourly ones; raw rows for the rest) for signals and
    series of longer windows (`collector.reads.long_signals`, `collector.reads.history`).
Every tier returns the same `totals.Totals` (percentiles from the same DDSketches of TTFT, e2e and
TPOT in every tier; rollup rows written before migration 0011 have none, and sums including them
fall back to their histograms, marked) and signals come from the one builder, `totals.signals_from`.

Where an answer needs per-request values that no aggregate keeps (s/token CDFs and the Mann-Whitney
test of /v1/compare, energy per token, tag values, per-position acceptance, acceptance vs length,
throughput by load), `queries.sample_rows` reads about `queries.SAMPLE_ROWS` of the window's
requests when it holds more: every request of `queries.SAMPLE_SLICES` short time slices spread
over the span the aggregates say the requests started in (`population`), each read by a range of
the started_at index, so a call costs what its sample does however busy the window. The answer
carries a `queries.Subset` saying how many of how many requests it rests on.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from sqlalchemy import Engine, func, select

from specwatch.collector.models import Request
from specwatch.collector.reads import acceptance_definitions, history, long_signals, queries, window_signals
from specwatch.collector.reads.queries import Filters, Signals, Window
from specwatch.collector.reads.series import SeriesPoint
from specwatch.collector.tiers.aggregates import LABELS
from specwatch.collector.tiers.totals import EMPTY, Totals, draft_fields


def tier(window: Window, filters: Filters) -> str:
    """Where signals and series of `window` are read from: raw | aggregates | rollups."""
    if filters.tags:
        return "raw"
    return "aggregates" if window.seconds <= history.RAW_WINDOW_LIMIT_S else "rollups"


def signals(db: Engine, window: Window, filters: Filters = Filters()) -> Signals:
    """The window's signals from its tier (`long_signals.auto_signals` picks it as `tier` says)."""
    return long_signals.auto_signals(db, window, filters)


def totals(
    db: Engine,
    window: Window,
    filters: Filters = Filters(),
    group_by: Sequence[str] = (),
    with_sketches: Sequence[str] = window_signals.ALL_SKETCHES,
) -> dict[tuple, Totals]:
    """Totals per value of `group_by` (labels of `aggregates.LABELS`) from the per-second aggregates
    (no tag filters: those read `sample_rows`)."""
    return window_signals.window_totals(db, window, group_by, filters, with_sketches)


def population(db: Engine, window: Window, filters: Filters) -> queries.Population | None:
    """The window's requests and the span they started in, from the aggregates (None with tag
    filters: the aggregates carry no tags, and such reads take every raw row)."""
    return None if filters.tags else population_of(window, totals(db, window, filters, (), ()).values())


def population_of(window: Window, groups: Iterable[Totals]) -> queries.Population:
    """The population of `window` from its totals of any grouping."""
    groups = list(groups)
    first, last = min((t.first_s for t in groups), default=math.inf), max((t.last_s for t in groups), default=-math.inf)
    return queries.Population.of(window, sum(t.requests for t in groups), first, last)


def positions(db: Engine, window: Window, filters: Filters = Filters()) -> queries.PositionAcceptance:
    return queries.per_position_acceptance(db, window, filters, population(db, window, filters))


def definitions(
    db: Engine, window: Window, filters: Filters = Filters()
) -> acceptance_definitions.AcceptanceDefinitions:
    return acceptance_definitions.definitions(db, window, filters, population(db, window, filters))


def acceptance_vs_length(
    db: Engine, window: Window, filters: Filters = Filters(), by: str = "prompt_tokens"
) -> queries.LengthCorrelation:
    return queries.acceptance_vs_length(db, window, filters, by, population=population(db, window, filters))


def errors_by_hour(db: Engine, window: Window, filters: Filters = Filters()) -> list[queries.HourOfDay]:
    """Requests, errors and OOMs by UTC hour of day: from the per-second aggregates up to
    RAW_WINDOW_LIMIT_S, hourly rollups beyond (`history.errors_by_hour_long`), raw rows with tags."""
    if tier(window, filters) != "aggregates":
        return history.errors_by_hour_long(db, window, filters)
    by_hour = window_signals.stepped_totals(db, window, 3600, (), filters, (), origin=0.0)
    counts = {h: [0, 0, 0] for h in range(24)}
    for (epoch_hour,), t in by_hour.items():
        for i, name in enumerate(("requests", "errors", "ooms")):
            counts[epoch_hour % 24][i] += int(t.sums[name])
    return [queries.HourOfDay(h, *counts[h]) for h in range(24)]


def label_values(
    db: Engine, window: Window, filters: Filters = Filters(), tag_keys: tuple[str, ...] = ("scenario",)
) -> dict[str, dict[str, int]]:
    """Requests per instance, model, drafter, mode, arm (from the aggregates) and tag value (counted
    in a sample and scaled to the window's requests, rounded: the key `sampled` then says
    {"rows": sample size, "of": requests}) in the window: the dashboard's filter choices and mode share."""
    if filters.tags:
        return _raw_label_values(db, window, filters, tag_keys)
    found: dict[str, dict[str, int]] = {label: {} for label in LABELS}
    by_labels = totals(db, window, filters, LABELS, ())
    for key, t in by_labels.items():
        for label, value in zip(LABELS, key):
            if value is not None:
                found[label][str(value)] = found[label].get(str(value), 0) + t.requests
    if not tag_keys:
        return found
    of = population_of(window, by_labels.values())
    tags = [Request.tags[key].as_string() for key in tag_keys]
    rows, sample = queries.sample_rows(db, select(*tags), window, filters, of)
    scale = of.requests / max(1, len(rows)) if sample else 1.0
    for i, key in enumerate(tag_keys):
        counts: dict[str, int] = {}
        for row in rows:
            if row[i] is not None:
                counts[str(row[i])] = counts.get(str(row[i]), 0) + 1
        found[f"tag:{key}"] = {value: round(n * scale) for value, n in counts.items()}
    return found | ({"sampled": {"rows": sample.rows, "of": sample.of}} if sample else {})


def _raw_label_values(db: Engine, window: Window, filters: Filters, tag_keys: tuple[str, ...]) -> dict:
    columns = {name: getattr(Request, name) for name in LABELS}
    columns |= {f"tag:{key}": Request.tags[key].as_string() for key in tag_keys}
    found = {}
    with db.connect() as conn:
        for name, column in columns.items():
            stmt = filters.apply(select(column, func.count()), window).group_by(column)
            found[name] = {str(v): n for v, n in conn.execute(stmt) if v is not None}
    return found


def series(db: Engine, window: Window, filters: Filters = Filters(), step_s: float = 60.0) -> list[SeriesPoint]:
    """Per-step series: from the per-second aggregates up to RAW_WINDOW_LIMIT_S (a request counts in
    the step its second starts in; percentiles from sketches), raw rows with tag filters, rollups beyond."""
    if step_s <= 0 or window.seconds / step_s > 100_000:
        raise ValueError("step_s must be positive and give at most 100000 points")
    if tier(window, filters) != "aggregates":
        return history.auto_series(db, window, filters, step_s)
    steps = math.ceil(window.seconds / step_s)
    by_step = window_signals.stepped_totals(db, window, step_s, (), filters)
    return [_point(window.start + i * step_s, by_step.get((i,), EMPTY)) for i in range(steps)]


def _point(t: float, totals: Totals) -> SeriesPoint:
    s = totals.sums
    ttft, e2e, tpot = (totals.percentiles(name) for name in ("ttft", "e2e", "tpot"))
    return SeriesPoint(
        t=t,
        requests=totals.requests,
        errors=int(s["errors"]),
        output_tokens=int(s["output_tokens"]),
        **draft_fields(totals),
        ttft_p50=ttft.p50,
        ttft_p99=ttft.p99,
        e2e_p50=e2e.p50,
        e2e_p99=e2e.p99,
        tpot_p50=tpot.p50,
        tpot_p99=tpot.p99,
    )
