"""Cost as a signal: each arm's $ per 1M output tokens on /metrics, and the daily cost series.

Both price what the store holds with the cost model (`cost.inputs.measured_inputs`, then
`cost.model.tco`) on the shipped price table, at the price of the GPU the device samples name
(`infer_gpu_type`), else `cost.summary.DEFAULT_GPU`, one GPU per instance.

    CostGauge(engine, prices, registry=...)   specwatch_cost_usd_per_mtok{arm} over the last hour
    daily_costs(engine, days, prices)         per UTC day and arm: $ and GPU-hours per 1M tokens

An arm's figure is an estimate when the cost model had to assume part of it: energy added to
the price but not metered (estimated, or not measured at all), memory not measured (or the
draft's share not separated from the target's), or device time derived from request times.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from collector.queries import Window
from cost.inputs import infer_gpu_type, measured_inputs
from cost.model import ArmCost, Prices, tco
from cost.summary import DEFAULT_GPU

log = logging.getLogger(__name__)
DAY_S = 86400
GAUGE = "specwatch_cost_usd_per_mtok"
GAUGE_DOC = "Total USD per 1M output tokens of each arm (mode:drafter) over the last hour, from the cost model."


@dataclass(frozen=True)
class DailyArmCost:
    day: str  # YYYY-MM-DD, UTC
    start: float  # the day's first second (epoch)
    arm: str  # ArmCost.key: "autoregressive", "speculative:ngram", ...
    mode: str
    drafter: str | None
    usd_per_mtok: float
    gpu_hours_per_mtok: float
    output_tokens: int
    requests: int
    estimate: bool
    estimated: tuple[str, ...]  # what the figure assumes, e.g. "energy estimate", "memory unmeasured"


@dataclass(frozen=True)
class DailyCost:
    days: int
    gpu_type: str
    gpu_type_source: str  # sampled (a device sample names it) | assumed (DEFAULT_GPU)
    rows: tuple[DailyArmCost, ...]  # by day, then arm


def estimated_parts(arm: ArmCost) -> tuple[str, ...]:
    """What the cost model assumed in this arm's $ per 1M tokens (empty: every part measured).
    Energy counts only where it is added: a cloud GPU-hour price already pays for power."""
    parts = []
    if arm.energy_added and arm.energy_source is None:
        parts.append("energy unmeasured")
    elif arm.energy_added and "estimate" in arm.energy_source:
        parts.append("energy estimate")
    if arm.memory_source not in ("measured", "given"):
        parts.append(f"memory {arm.memory_source}")
    if arm.device_s_source == "derived":
        parts.append("device time derived from request times")
    return tuple(parts)


def _gpu_type(engine: Engine, window: Window, prices: Prices) -> tuple[str, str]:
    found = infer_gpu_type(engine, window, prices)
    return (found, "sampled") if found else (DEFAULT_GPU, "assumed")


def arm_costs(engine: Engine, window: Window, prices: Prices, gpu_type: str) -> list[tuple[ArmCost, int, int]]:
    """(cost, output tokens, requests) of each arm served in `window`."""
    inputs = measured_inputs(engine, window, prices, gpu_type=gpu_type)
    served = {arm.key: (arm.output_tokens, arm.requests) for arm in inputs.arms}
    return [(arm, *served[arm.key]) for arm in tco(inputs).arms]


def daily_costs(engine: Engine, days: int, prices: Prices, now: float | None = None) -> DailyCost:
    """The last `days` UTC days up to `now` (today so far included), each priced on its own."""
    end = time.time() if now is None else now
    today = math.floor(end / DAY_S) * DAY_S
    starts = [today - DAY_S * k for k in range(days - 1, -1, -1)]
    gpu_type, source = _gpu_type(engine, Window(starts[0], max(end, starts[0] + 1)), prices)
    rows = []
    for start in starts:
        if (day_end := min(start + DAY_S, end)) > start:
            day = time.strftime("%Y-%m-%d", time.gmtime(start))
            for arm, tokens, requests in arm_costs(engine, Window(start, day_end), prices, gpu_type):
                rows.append(_daily_row(day, start, arm, tokens, requests))
    return DailyCost(days, gpu_type, source, tuple(rows))


def _daily_row(day: str, start: float, arm: ArmCost, tokens: int, requests: int) -> DailyArmCost:
    parts = estimated_parts(arm)
    return DailyArmCost(
        day,
        start,
        arm.key,
        arm.mode,
        arm.drafter,
        arm.total_usd_per_mtok,
        arm.gpu_hours_per_mtok,
        int(tokens),
        int(requests),
        bool(parts),
        parts,
    )


class CostGauge:
    """A prometheus_client collector of `specwatch_cost_usd_per_mtok{arm}` over the last `window_s`.

    The cost model runs a few aggregate queries, so its answer is kept `ttl_s` and scrapes in
    between reuse it. No series while the window holds no arm; a failing query logs a warning and
    exports nothing rather than failing the whole scrape.
    """

    def __init__(
        self,
        engine: Engine,
        prices: Prices,
        *,
        registry: CollectorRegistry,
        window_s: float = 3600.0,
        ttl_s: float = 60.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._engine, self._prices = engine, prices
        self._window_s, self._ttl_s, self._clock = window_s, ttl_s, clock
        self._lock = threading.Lock()
        self._measured_at: float | None = None
        self._values: tuple[tuple[str, float], ...] = ()
        registry.register(self)

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(GAUGE, GAUGE_DOC, labels=["arm"])

    def collect(self) -> Iterator[Metric]:
        values = self._current()
        if values:
            family = GaugeMetricFamily(GAUGE, GAUGE_DOC, labels=["arm"])
            for arm, usd in values:
                family.add_metric([arm], usd)
            yield family

    def _current(self) -> tuple[tuple[str, float], ...]:
        with self._lock:
            now = self._clock()
            if self._measured_at is None or now - self._measured_at >= self._ttl_s:
                self._values, self._measured_at = self._measure(now), now
            return self._values

    def _measure(self, now: float) -> tuple[tuple[str, float], ...]:
        window = Window(now - self._window_s, now)
        try:
            gpu_type, _ = _gpu_type(self._engine, window, self._prices)
            return tuple(
                (arm.key, arm.total_usd_per_mtok)
                for arm, _, _ in arm_costs(self._engine, window, self._prices, gpu_type)
            )
        except (ValueError, SQLAlchemyError) as exc:
            log.warning("%s not exported: the cost model failed: %s", GAUGE, exc)
            return ()
