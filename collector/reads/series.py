"""Time series over a window (per minute by default) and the latest device readings."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sqlalchemy import Engine, and_, func, select

from specwatch.collector.models import DeviceSampleRow, EngineEventRow, Request
from specwatch.collector.reads.queries import LATENCY_AND_DRAFT_COLUMNS, Filters, Window


@dataclass(frozen=True)
class SeriesPoint:
    """One step of the series; `t` is the step's start (epoch s). Ratios are None without data."""

    t: float
    requests: int
    errors: int
    output_tokens: int
    drafts: int
    draft_tokens: int
    accepted_tokens: int
    acceptance_rate: float | None
    acceptance_rate_mean: float | None  # across the step's requests that drafted
    acceptance_rate_stddev: float | None
    mean_acceptance_length: float | None
    ttft_p50: float | None
    ttft_p99: float | None
    e2e_p50: float | None
    e2e_p99: float | None
    tpot_p50: float | None = None  # time per output token after the first (None from rollups before migration 0011)
    tpot_p99: float | None = None


_COLUMNS = (Request.started_at, *LATENCY_AND_DRAFT_COLUMNS, Request.status)


def series(db: Engine, window: Window, filters: Filters = Filters(), step_s: float = 60.0) -> list[SeriesPoint]:
    """Per-step counts, acceptance and latency percentiles, computed in numpy from raw rows."""
    if step_s <= 0 or window.seconds / step_s > 100_000:
        raise ValueError("step_s must be positive and give at most 100000 points")
    with db.connect() as conn:
        rows = conn.execute(filters.apply(select(*_COLUMNS), window)).all()
    steps = int(np.ceil(window.seconds / step_s))
    if not rows:
        return [_point(window.start + i * step_s) for i in range(steps)]
    started, ttft, e2e, out, drafts, drafted, accepted = (np.array(c, dtype=float) for c in list(zip(*rows))[:7])
    index = np.minimum(((started - window.start) // step_s).astype(np.int64), steps - 1)
    sums = {
        name: np.bincount(index, weights=values, minlength=steps)
        for name, values in (("out", out), ("drafts", drafts), ("drafted", drafted), ("accepted", accepted))
    }
    counts = np.bincount(index, minlength=steps)
    rate_mean, rate_std = _rate_moments(index, drafted, accepted, steps)
    errors = np.bincount(
        index, weights=np.array([s == "error" for s in list(zip(*rows))[7]], dtype=float), minlength=steps
    )
    ttft_q, e2e_q = (
        grouped_quantiles(index, ttft, steps, (0.5, 0.99)),
        grouped_quantiles(index, e2e, steps, (0.5, 0.99)),
    )
    tpot = np.where((out > 1) & ~np.isnan(ttft), (e2e - ttft) / np.maximum(out - 1, 1), np.nan)
    tpot_q = grouped_quantiles(index, tpot, steps, (0.5, 0.99))
    return [
        SeriesPoint(
            t=window.start + i * step_s,
            requests=int(counts[i]),
            errors=int(errors[i]),
            output_tokens=int(sums["out"][i]),
            drafts=int(sums["drafts"][i]),
            draft_tokens=int(sums["drafted"][i]),
            accepted_tokens=int(sums["accepted"][i]),
            acceptance_rate=_div(sums["accepted"][i], sums["drafted"][i]),
            acceptance_rate_mean=_num(rate_mean[i]),
            acceptance_rate_stddev=_num(rate_std[i]),
            mean_acceptance_length=None
            if not sums["drafts"][i]
            else float(1.0 + sums["accepted"][i] / sums["drafts"][i]),
            ttft_p50=_num(ttft_q[0][i]),
            ttft_p99=_num(ttft_q[1][i]),
            e2e_p50=_num(e2e_q[0][i]),
            e2e_p99=_num(e2e_q[1][i]),
            tpot_p50=_num(tpot_q[0][i]),
            tpot_p99=_num(tpot_q[1][i]),
        )
        for i in range(steps)
    ]


def _point(t: float) -> SeriesPoint:
    return SeriesPoint(t, 0, 0, 0, 0, 0, 0, None, None, None, None, None, None, None, None)


def rate_moments(n: np.ndarray, total: np.ndarray, m2: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and population stddev from count, sum and M2, the sum of squared deviations (NaN where n == 0)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(n > 0, total / n, np.nan), np.where(n > 0, np.sqrt(np.maximum(0.0, m2 / n)), np.nan)


def _rate_moments(index: np.ndarray, drafted: np.ndarray, accepted: np.ndarray, steps: int):
    drafting = drafted > 0
    rate = accepted[drafting] / drafted[drafting]
    where = index[drafting]
    n, total = np.bincount(where, minlength=steps), np.bincount(where, weights=rate, minlength=steps)
    mean = np.divide(total, n, out=np.zeros(steps), where=n > 0)
    m2 = np.bincount(where, weights=(rate - mean[where]) ** 2, minlength=steps)
    return rate_moments(n, total, m2)


def _div(num: float, den: float) -> float | None:
    return float(num / den) if den else None


def _num(value: float) -> float | None:
    return None if np.isnan(value) else float(value)


def grouped_quantiles(group: np.ndarray, values: np.ndarray, groups: int, quantiles) -> list[np.ndarray]:
    """Exact per-group quantiles (numpy's linear method) without a Python loop over groups; NaNs ignored."""
    keep = ~np.isnan(values)
    group, values = group[keep], values[keep]
    if not values.size:
        return [np.full(groups, np.nan) for _ in quantiles]
    order = np.lexsort((values, group))  # by group, then value
    values = values[order]
    counts = np.bincount(group, minlength=groups)
    starts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    last = starts + np.maximum(counts - 1, 0)  # index of each group's largest value
    out = []
    for q in quantiles:
        pos = starts + q * (last - starts)
        lo = np.minimum(np.floor(pos).astype(np.int64), values.size - 1)
        hi = np.minimum(np.minimum(lo + 1, last), values.size - 1)
        result = values[lo] + (values[hi] - values[lo]) * (pos - lo)
        out.append(np.where(counts > 0, result, np.nan))
    return out


@dataclass(frozen=True)
class DeviceSnapshot:
    instance: str
    device: str
    at: float
    mem_allocated_bytes: int
    mem_reserved_bytes: int
    fragmentation: float | None
    power_w: float | None
    power_source: str | None
    util_target: float | None
    util_draft: float | None
    active_requests: int
    queue_depth: int
    load: float | None
    draft_loaded: bool | None
    default_mode: str | None


def latest_device_samples(db: Engine, instance: str | None = None) -> list[DeviceSnapshot]:
    """The newest sample of every (instance, device)."""
    latest = select(DeviceSampleRow.instance, DeviceSampleRow.device, func.max(DeviceSampleRow.at).label("at"))
    if instance is not None:
        latest = latest.where(DeviceSampleRow.instance == instance)
    latest = latest.group_by(DeviceSampleRow.instance, DeviceSampleRow.device).subquery()
    fields = [getattr(DeviceSampleRow, f) for f in DeviceSnapshot.__dataclass_fields__]
    stmt = (
        select(*fields)
        .join(
            latest,
            and_(
                DeviceSampleRow.instance == latest.c.instance,
                DeviceSampleRow.device == latest.c.device,
                DeviceSampleRow.at == latest.c.at,
            ),
        )
        .order_by(DeviceSampleRow.instance, DeviceSampleRow.device)
    )
    with db.connect() as conn:
        return [DeviceSnapshot(*row) for row in conn.execute(stmt)]


@dataclass(frozen=True)
class EventRecord:
    instance: str
    at: float
    kind: str
    detail: dict
    duration_s: float | None


def engine_events(
    db: Engine, window: Window, instance: str | None = None, kind: str | None = None, limit: int = 1000
) -> list[EventRecord]:
    """Engine events (mode switches, defrags, OOMs, ...) in the window, oldest first, at most `limit`."""
    stmt = select(
        EngineEventRow.instance,
        EngineEventRow.at,
        EngineEventRow.kind,
        EngineEventRow.detail,
        EngineEventRow.duration_s,
    )
    stmt = stmt.where(EngineEventRow.at >= window.start, EngineEventRow.at < window.end)
    if instance is not None:
        stmt = stmt.where(EngineEventRow.instance == instance)
    if kind is not None:
        stmt = stmt.where(EngineEventRow.kind == kind)
    with db.connect() as conn:
        return [EventRecord(*row) for row in conn.execute(stmt.order_by(EngineEventRow.at).limit(limit))]
