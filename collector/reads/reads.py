"""Reads of request, device-sample, engine-event and vLLM-scrape rows that alert signals, the monthly
report and the vLLM check need, as plain values: ORM rows never leave the collector.

Every function takes the store's engine and a `Window` ([start, end) in epoch seconds) and returns
frozen dataclasses (numpy arrays of the values a statistic needs, grouped by label values).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from sqlalchemy import Engine, func, select

from specwatch.collector.models import DeviceSampleRow, EngineEventRow, Request, RequestRollupHourly, VllmScrape
from specwatch.collector.reads.queries import Filters, Window

ARMS = ("spec", "control")


@dataclass(frozen=True)
class Group:
    """The rows of one label set: `key` holds the label values (in group-by order), `values` one
    float column per asked column (NaN for NULL)."""

    key: tuple
    values: np.ndarray  # shape (rows, columns)


@dataclass(frozen=True)
class ArmLatency:
    """e2e seconds per output token of the ok requests of each A/B arm, for one label set."""

    key: tuple
    spec: np.ndarray
    control: np.ndarray


@dataclass(frozen=True)
class ModeDeviceTime:
    """Σ device seconds, Σ output tokens and requests of one mode for one label set (ok requests with
    output that carry `device_s`)."""

    key: tuple
    mode: str
    device_s: float
    output_tokens: int
    requests: int


@dataclass(frozen=True)
class OomCounts:
    """Out-of-memory failures per instance: requests whose error names an OOM, and `oom` engine events."""

    from_requests: dict[str, int]
    from_events: dict[str, int]


@dataclass(frozen=True)
class ScrapeRow:
    """One stored vLLM scrape (counter deltas since the previous one)."""

    at: float
    interval_s: float
    counter_reset: bool
    drafts: float
    draft_tokens: float
    accepted_tokens: float
    ttft_counts: tuple[float, ...]
    e2e_counts: tuple[float, ...]


def _in(column, window: Window):
    return (column >= window.start, column < window.end)


def _groups(rows: Sequence[tuple], k: int) -> tuple[Group, ...]:
    """Rows whose first k columns are labels -> one Group per label set (float arrays of the rest)."""
    found: dict[tuple, list[tuple]] = defaultdict(list)
    for row in rows:
        found[tuple(row[:k])].append(row[k:])
    return tuple(Group(key, np.array(values, dtype=float)) for key, values in found.items())


def _read(db: Engine, stmt) -> list[tuple]:
    with db.connect() as conn:
        return [tuple(row) for row in conn.execute(stmt)]


def request_values(db: Engine, window: Window, group_by: Sequence[str], columns: Sequence[str]) -> tuple[Group, ...]:
    """The window's requests' `columns` (Request column names), grouped by `group_by`."""
    labels = [getattr(Request, g) for g in group_by]
    stmt = select(*labels, *(getattr(Request, c) for c in columns)).where(*_in(Request.started_at, window))
    return _groups(_read(db, stmt), len(group_by))


def arm_latency(db: Engine, window: Window, group_by: Sequence[str]) -> tuple[ArmLatency, ...]:
    """Per label set, the A/B arms' ok requests' e2e seconds per output token."""
    stmt = select(*(getattr(Request, g) for g in group_by), Request.arm, Request.e2e_s / Request.output_tokens).where(
        *_in(Request.started_at, window), Request.arm.in_(ARMS), Request.status == "ok", Request.output_tokens > 0
    )
    k, arms = len(group_by), defaultdict(lambda: {arm: [] for arm in ARMS})
    for row in _read(db, stmt):
        arms[row[:k]][row[k]].append(float(row[k + 1]))
    return tuple(ArmLatency(key, np.array(a["spec"]), np.array(a["control"])) for key, a in arms.items())


def device_time_by_mode(db: Engine, window: Window, group_by: Sequence[str]) -> tuple[ModeDeviceTime, ...]:
    """Per label set and mode: Σ device_s, Σ output tokens and the count of ok requests with output
    that carry device_s."""
    labels = [*(getattr(Request, g) for g in group_by), Request.mode]
    stmt = (
        select(*labels, func.sum(Request.device_s), func.sum(Request.output_tokens), func.count())
        .where(
            *_in(Request.started_at, window),
            Request.status == "ok",
            Request.output_tokens > 0,
            Request.device_s.is_not(None),
        )
        .group_by(*labels)
    )
    k = len(group_by)
    return tuple(
        ModeDeviceTime(row[:k], row[k], float(row[k + 1]), int(row[k + 2]), int(row[k + 3])) for row in _read(db, stmt)
    )


def oom_events(db: Engine, window: Window) -> dict[str, int]:
    """instance -> `oom` engine events in the window."""
    stmt = (
        select(EngineEventRow.instance, func.count())
        .where(*_in(EngineEventRow.at, window), EngineEventRow.kind == "oom")
        .group_by(EngineEventRow.instance)
    )
    return dict(_read(db, stmt))


def oom_counts(db: Engine, window: Window) -> OomCounts:
    """Per instance, the window's requests that failed with an OOM and its `oom` engine events."""
    stmt = (
        select(Request.instance, func.count())
        .where(*_in(Request.started_at, window), Request.error.like("%oom%"))
        .group_by(Request.instance)
    )
    return OomCounts(dict(_read(db, stmt)), oom_events(db, window))


def device_values(db: Engine, window: Window, group_by: Sequence[str], column: str) -> tuple[Group, ...]:
    """The window's device samples' non-null `column`, grouped by `group_by` (one column of values)."""
    value = getattr(DeviceSampleRow, column)
    stmt = select(*(getattr(DeviceSampleRow, g) for g in group_by), value).where(
        *_in(DeviceSampleRow.at, window), value.is_not(None)
    )
    return _groups(_read(db, stmt), len(group_by))


def vllm_keys(db: Engine, window: Window, group_by: Sequence[str]) -> tuple[tuple, ...]:
    """The distinct values of `group_by` (VllmScrape columns: source, model) scraped in the window."""
    stmt = select(*(getattr(VllmScrape, g) for g in group_by)).where(*_in(VllmScrape.at, window)).distinct()
    return tuple(_read(db, stmt))


def vllm_scrapes(db: Engine) -> tuple[ScrapeRow, ...]:
    """Every stored vLLM scrape, oldest first."""
    columns = [getattr(VllmScrape, f) for f in ScrapeRow.__dataclass_fields__]
    with db.connect() as conn:
        rows = conn.execute(select(*columns).order_by(VllmScrape.at)).all()
    return tuple(ScrapeRow(*row[:6], tuple(row.ttft_counts), tuple(row.e2e_counts)) for row in rows)


def raw_request_count(db: Engine, window: Window) -> int:
    """Requests in the window still held as raw rows."""
    with db.connect() as conn:
        return int(conn.scalar(Filters().apply(select(func.count()).select_from(Request), window)) or 0)


def request_label_values(db: Engine, window: Window, column: str) -> frozenset:
    """The distinct values of a request label (mode, drafter, arm) in the window, from the hourly
    rollups and the raw rows (rollups store '' for a null drafter or arm)."""
    values: set = set()
    with db.connect() as conn:
        for table, at in ((RequestRollupHourly, RequestRollupHourly.period_start), (Request, Request.started_at)):
            values |= set(conn.scalars(select(getattr(table, column)).where(*_in(at, window)).distinct()))
    return frozenset(values)
