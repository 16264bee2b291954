"""Read side of the store: what alerts, reports and the dashboard ask about a time window.

Every function takes an Engine, a `Window` and `Filters` and returns plain frozen
dataclasses (ORM rows never leave the collector). Percentiles are exact: the window's
raw values are pulled into numpy (SQLite has no percentile function, and one column into
numpy beats window-function emulation). Definitions follow vLLM:

    acceptance rate          = accepted tokens / draft tokens            (over the window)
    mean acceptance length   = 1 + accepted tokens / drafts
    per-position acceptance  = drafts accepted through position i / drafts
    TPOT                     = (e2e - ttft) / (output tokens - 1)        (requests with > 1 token)
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from sqlalchemy import Engine, Select, and_, func, select, union_all

from specwatch.collector.models import Request

QUANTILES = (0.5, 0.9, 0.95, 0.99)


@dataclass(frozen=True)
class Window:
    """[start, end) in epoch seconds."""

    start: float
    end: float

    def __post_init__(self) -> None:
        if not self.end > self.start:
            raise ValueError("window end must be after its start")

    @classmethod
    def last(cls, seconds: float, now: float | None = None) -> Window:
        end = time.time() if now is None else now
        return cls(end - seconds, end)

    @property
    def seconds(self) -> float:
        return self.end - self.start


@dataclass(frozen=True)
class Filters:
    """Request filters; `drafter="none"` selects requests without a drafter."""

    instance: str | None = None
    model: str | None = None
    drafter: str | None = None
    mode: str | None = None
    arm: str | None = None
    tags: tuple[tuple[str, str], ...] = ()

    def apply(self, stmt: Select, window: Window, time_index: bool = True) -> Select:
        """Add the window and filter conditions. time_index=False keeps the planner off the
        started_at index (`started_at + 0`) and the instance index (`instance || ''`), for queries
        that narrow rows by id or walk another index instead."""
        started_at = Request.started_at if time_index else Request.started_at + 0
        return stmt.where(and_(started_at >= window.start, started_at < window.end, *self.conditions(time_index)))

    def conditions(self, time_index: bool = True) -> list:
        """The label and tag conditions (no window): what `apply` adds, and what marks a view's rows."""
        cond = []
        for column in ("instance", "model", "mode", "arm"):
            if (value := getattr(self, column)) is not None:
                indexed = time_index or column != "instance"
                cond.append((getattr(Request, column) if indexed else Request.instance + "") == value)
        if self.drafter is not None:
            cond.append(Request.drafter.is_(None) if self.drafter == "none" else Request.drafter == self.drafter)
        cond.extend(Request.tags[key].as_string() == value for key, value in self.tags)
        return cond

    @property
    def scope(self) -> Filters:
        """The instances' whole workload: this filter's instance only (what a narrower view is part of)."""
        return Filters(instance=self.instance)


@dataclass(frozen=True)
class Percentiles:
    """Quantile -> seconds (None when the window holds no value).

    `basis`: None when computed from the values (exactly from raw rows, or from DDSketches within
    1%); "histogram" when interpolated in latency buckets (rollup rows written before migration
    0011, which carry no sketch and no TPOT: `collector.reads.long_signals`)."""

    p50: float | None = None
    p90: float | None = None
    p95: float | None = None
    p99: float | None = None
    count: int = 0
    basis: str | None = None


@dataclass(frozen=True)
class Signals:
    """The window's headline numbers (one query): what alert rules evaluate."""

    window: Window
    requests: int
    errors: int
    ooms: int
    output_tokens: int
    active_s: float  # seconds from the first second with a request to the end of the last (`active_span`)
    request_rate_per_s: float  # per active second
    output_tokens_per_s: float  # per active second
    drafts: int
    draft_tokens: int
    accepted_tokens: int
    acceptance_rate: float | None
    acceptance_rate_mean: float | None  # across requests that drafted
    acceptance_rate_stddev: float | None
    mean_acceptance_length: float | None
    ttft: Percentiles
    e2e: Percentiles
    tpot: Percentiles


# what a request's latency and acceptance figures are computed from (signals, series, breakdowns)
LATENCY_AND_DRAFT_COLUMNS = (
    Request.ttft_s,
    Request.e2e_s,
    Request.output_tokens,
    Request.num_drafts,
    Request.num_draft_tokens,
    Request.num_accepted_tokens,
)
_SIGNAL_COLUMNS = (*LATENCY_AND_DRAFT_COLUMNS, Request.status, Request.error, Request.started_at)


def active_span(window: Window, first_s: float, last_s: float) -> float:
    """Seconds of `window` from `first_s` (the first request's start) to `last_s` (the last one's
    finish): the time the work took, what rates are per (collector.tiers.totals)."""
    return max(0.0, min(window.end, last_s) - max(window.start, first_s))


def signals(db: Engine, window: Window, filters: Filters = Filters()) -> Signals:
    with db.connect() as conn:
        rows = conn.execute(filters.apply(select(*_SIGNAL_COLUMNS), window)).all()
    ttft, e2e, out, drafts, drafted, accepted = _float_columns(rows, 6)
    status = [r[6] for r in rows]
    per_request = np.divide(accepted, drafted, out=np.full_like(accepted, np.nan), where=drafted > 0)
    started = [r[8] for r in rows]
    active = active_span(window, min(started), float(np.max(np.add(started, e2e)))) if rows else 0.0
    return Signals(
        window=window,
        requests=len(rows),
        errors=sum(s == "error" for s in status),
        ooms=sum(1 for r in rows if r[7] and "oom" in r[7]),
        output_tokens=int(out.sum()),
        active_s=active,
        request_rate_per_s=len(rows) / active if active else 0.0,
        output_tokens_per_s=float(out.sum()) / active if active else 0.0,
        drafts=int(drafts.sum()),
        draft_tokens=int(drafted.sum()),
        accepted_tokens=int(accepted.sum()),
        acceptance_rate=_ratio(accepted.sum(), drafted.sum()),
        acceptance_rate_mean=_nan_stat(np.nanmean, per_request),
        acceptance_rate_stddev=_nan_stat(np.nanstd, per_request),
        mean_acceptance_length=None if not drafts.sum() else 1.0 + float(accepted.sum() / drafts.sum()),
        ttft=percentiles(ttft),
        e2e=percentiles(e2e),
        tpot=percentiles(_tpot(ttft, e2e, out)),
    )


def _float_columns(rows: Sequence[tuple], n: int) -> list[np.ndarray]:
    if not rows:
        return [np.zeros(0) for _ in range(n)]
    return [np.array(column, dtype=float) for column in list(zip(*rows))[:n]]


def _tpot(ttft: np.ndarray, e2e: np.ndarray, out: np.ndarray) -> np.ndarray:
    ok = (out > 1) & ~np.isnan(ttft)
    return (e2e[ok] - ttft[ok]) / (out[ok] - 1)


def _ratio(num: float, den: float) -> float | None:
    return float(num / den) if den else None


def _nan_stat(fn, values: np.ndarray) -> float | None:
    values = values[~np.isnan(values)]
    return float(fn(values)) if values.size else None


def percentiles(values: np.ndarray, quantiles: Sequence[float] = QUANTILES) -> Percentiles:
    """Exact percentiles of the non-NaN values (linear interpolation, numpy's default)."""
    values = values[~np.isnan(values)]
    if not values.size:
        return Percentiles()
    p50, p90, p95, p99 = (float(v) for v in np.quantile(values, quantiles))
    return Percentiles(p50, p90, p95, p99, int(values.size))


SAMPLE_ROWS = 20_000
SAMPLE_SLICES = 50
_GOLDEN = (math.sqrt(5) - 1) / 2  # the golden-ratio sequence: well-spread offsets in [0, 1)


@dataclass(frozen=True)
class Subset:
    """An answer's per-request figures rest on `rows` of the window's `of` requests."""

    rows: int
    of: int


@dataclass(frozen=True)
class Population:
    """What a sample is drawn from: the requests of a window (with its filters) and the span they
    started in (both from the per-second aggregates: `collector.reads.reader.population`)."""

    requests: int
    span: Window

    @classmethod
    def of(cls, window: Window, requests: int, first_s: float, last_s: float) -> Population:
        start, end = max(window.start, first_s), min(window.end, last_s)
        return cls(requests, Window(start, end) if requests and end > start else window)


def sample_slices(population: Population) -> list[Window]:
    """SAMPLE_SLICES time slices of the population's span that together hold about SAMPLE_ROWS of
    its requests at its mean rate: the span cut in SAMPLE_SLICES equal strata, one slice of
    SAMPLE_ROWS / requests of its stratum in each, at a deterministic quasi-random offset (the
    golden-ratio sequence: slices do not fall in step with periodic traffic)."""
    span, fraction = population.span, min(1.0, SAMPLE_ROWS / max(1, population.requests))
    stratum = span.seconds / SAMPLE_SLICES
    width = fraction * stratum
    starts = (span.start + i * stratum + ((i + 1) * _GOLDEN % 1.0) * (stratum - width) for i in range(SAMPLE_SLICES))
    return [Window(lo, lo + width) for lo in starts if width > 0]


def sample_rows(
    db: Engine, stmt: Select, window: Window, filters: Filters, population: Population | None
) -> tuple[list, Subset | None]:
    """The rows of `stmt` (over requests) in `window` under `filters`: all of them when the
    population (None: unknown, e.g. with tag filters) holds at most SAMPLE_ROWS requests, else those
    in `sample_slices` (one UNION ALL of a branch per slice, each read by a range of the started_at
    index: the cost follows the sample, not the window), with the sample's size."""
    if population is None or population.requests <= SAMPLE_ROWS:
        with db.connect() as conn:
            return conn.execute(filters.apply(stmt, window)).all(), None
    with db.connect() as conn:
        rows = conn.execute(union_all(*(filters.apply(stmt, piece) for piece in sample_slices(population)))).all()
    return rows, Subset(len(rows), population.requests)


@dataclass(frozen=True)
class PositionAcceptance:
    """Per draft position i: the share of drafts whose tokens 0..i were all accepted."""

    drafts: int
    rates: list[float] = field(default_factory=list)
    sampled: Subset | None = None


def per_position_acceptance(
    db: Engine, window: Window, filters: Filters = Filters(), population: Population | None = None
) -> PositionAcceptance:
    """population: the window's requests, when known (a large window reads a sample: `sample_rows`)."""
    stmt = select(Request.num_drafts, Request.accepted_per_position).where(Request.gamma > 0)
    rows, sample = sample_rows(db, stmt, window, filters, population)
    if not rows:
        return PositionAcceptance(0, sampled=sample)
    width = max(len(per_pos) for _, per_pos in rows)
    totals = np.zeros(width)
    for _, per_pos in rows:
        totals[: len(per_pos)] += per_pos
    drafts = sum(n for n, _ in rows)
    return PositionAcceptance(drafts, [float(t / drafts) if drafts else 0.0 for t in totals], sample)


LENGTH_EDGES = (0, 64, 128, 256, 512, 1024, 2048, 4096)


@dataclass(frozen=True)
class LengthBucket:
    low: int
    high: int | None  # None: unbounded
    requests: int
    acceptance_rate: float | None


@dataclass(frozen=True)
class LengthCorrelation:
    """Does acceptance depend on length? Spearman's rho over requests that drafted."""

    by: str
    requests: int
    spearman_rho: float | None
    p_value: float | None
    buckets: list[LengthBucket]
    points: list[tuple[float, float]] = field(default_factory=list)  # (length, acceptance), at most MAX_POINTS
    sampled: Subset | None = None


MAX_POINTS = 2000


def acceptance_vs_length(
    db: Engine,
    window: Window,
    filters: Filters = Filters(),
    by: str = "prompt_tokens",
    edges: Sequence[int] = LENGTH_EDGES,
    population: Population | None = None,
) -> LengthCorrelation:
    """population: the window's requests, when known (a large window reads a sample: `sample_rows`)."""
    from scipy.stats import spearmanr

    if by not in ("prompt_tokens", "output_tokens"):
        raise ValueError("by must be prompt_tokens or output_tokens")
    columns = (getattr(Request, by), Request.num_draft_tokens, Request.num_accepted_tokens)
    stmt = select(*columns).where(Request.num_draft_tokens > 0)
    rows, sample = sample_rows(db, stmt, window, filters, population)
    length, drafted, accepted = _float_columns(rows, 3)
    rate = accepted / np.where(drafted > 0, drafted, 1)
    rho = p = None
    if len(rows) >= 3 and np.ptp(length) > 0 and np.ptp(rate) > 0:
        result = spearmanr(length, rate)
        rho, p = float(result.statistic), float(result.pvalue)
    pick = np.linspace(0, len(rows) - 1, min(len(rows), MAX_POINTS)).astype(int) if rows else []
    points = [(float(length[i]), float(rate[i])) for i in pick]
    buckets = _length_buckets(length, drafted, accepted, edges)
    return LengthCorrelation(by, len(rows), rho, p, buckets, points, sample)


def _length_buckets(length, drafted, accepted, edges: Sequence[int]) -> list[LengthBucket]:
    buckets = []
    bounds = list(edges) + [None]
    for low, high in zip(bounds[:-1], bounds[1:]):
        inside = (length >= low) & (length < (np.inf if high is None else high))
        buckets.append(
            LengthBucket(low, high, int(inside.sum()), _ratio(accepted[inside].sum(), drafted[inside].sum()))
        )
    return buckets


@dataclass(frozen=True)
class HourOfDay:
    hour: int  # 0..23, UTC
    requests: int
    errors: int
    ooms: int


def errors_by_hour(
    db: Engine, window: Window, filters: Filters = Filters(), after_id: int | None = None
) -> list[HourOfDay]:
    """Error and OOM counts by UTC hour of day (is there a time when things break?).

    after_id: only requests stored after that id (the rollups' not-yet-rolled rows)."""
    hour = func.floor(Request.started_at / 3600)  # epoch hour; folded to the hour of day below
    is_error = (Request.status == "error").cast(Request.retries.type)
    is_oom = Request.error.like("%oom%").cast(Request.retries.type)
    stmt = filters.apply(
        select(
            hour.label("hour"), func.count(), func.coalesce(func.sum(is_error), 0), func.coalesce(func.sum(is_oom), 0)
        ),
        window,
        time_index=after_id is None,
    ).group_by(hour)
    if after_id is not None:
        stmt = stmt.where(Request.id > after_id)
    totals = np.zeros((24, 3), dtype=np.int64)
    with db.connect() as conn:
        for epoch_hour, *counts in conn.execute(stmt):
            totals[int(epoch_hour) % 24] += [int(c) for c in counts]
    return [HourOfDay(h, *(int(x) for x in totals[h])) for h in range(24)]
