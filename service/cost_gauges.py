"""Cost as Prometheus gauges: each arm's $ per 1M output tokens on /metrics, and the daily cost series.

Both price what the store holds with the cost model (`cost.inputs.measured_inputs`, then
`cost.model.tco`) on the shipped price table, each instance at the price of the GPU its own device
samples name (a mixed fleet is billed per instance, as `specwatch cost` bills it), an instance with
none at the GPU the store's samples name most (`infer_gpu_type`), else `cost.summary.DEFAULT_GPU`;
one GPU per instance.

    CostGauge(db, prices, registry=...)   specwatch_cost_usd_per_mtok{arm} over the last hour
    DailyCosts(db, prices).series(days)   per UTC day and arm: $ and GPU-hours per 1M tokens

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

from specwatch.collector.reads.queries import Window
from specwatch.cost.inputs import infer_gpu_type, measured_inputs
from specwatch.cost.model import ArmCost, Prices, tco
from specwatch.cost.sharing import derived_in
from specwatch.cost.summary import DEFAULT_GPU

log = logging.getLogger(__name__)
DAY_S = 86400
MAX_DAYS = 90  # the longest daily series
FINAL_AFTER_S = 3600.0  # a day's figures are final this long after it ended (late telemetry is in)
GAUGE = "specwatch_cost_usd_per_mtok"
# The arms exported (those with the most output tokens): a drafter `model:NAME` is a producer's string,
# so the arms a window holds are not bounded (issue 53 #2).
MAX_ARMS = 32
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
    if derived_in(arm.device_s_source):
        parts.append("device time derived from request times")
    return tuple(parts)


def _gpu_type(db: Engine, window: Window, prices: Prices) -> tuple[str, str]:
    found = infer_gpu_type(db, window, prices)
    return (found, "sampled") if found else (DEFAULT_GPU, "assumed")


def arm_costs(db: Engine, window: Window, prices: Prices, gpu_type: str) -> list[tuple[ArmCost, int, int]]:
    """(cost, output tokens, requests) of each arm served in `window`."""
    inputs = measured_inputs(db, window, prices, gpu_type=gpu_type, per_instance=True)
    served = {arm.key: (arm.output_tokens, arm.requests) for arm in inputs.arms}
    return [(arm, *served[arm.key]) for arm in tco(inputs).arms]


def price_day(db: Engine, start: float, end: float, prices: Prices, gpu_type: str) -> tuple[DailyArmCost, ...]:
    """Each arm's figures for the UTC day that begins at `start`, from its requests up to `end`."""
    day = time.strftime("%Y-%m-%d", time.gmtime(start))
    return tuple(
        _daily_row(day, start, arm, tokens, requests)
        for arm, tokens, requests in arm_costs(db, Window(start, end), prices, gpu_type)
    )


class DailyCosts:
    """The daily cost series, each day's figures kept once priced.

    The cost model reads every request of a day, so pricing a day costs about as much as its
    traffic (measured: ~26 us per request on SQLite). A day is priced again only while it can still
    change (today, or ended less than FINAL_AFTER_S ago: late telemetry) and its figures are older
    than `ttl_s`; days further back than MAX_DAYS are forgotten.
    """

    def __init__(
        self, db: Engine, prices: Prices, *, ttl_s: float = 300.0, clock: Callable[[], float] = time.time
    ) -> None:
        self._engine, self._prices, self._ttl_s, self._clock = db, prices, ttl_s, clock
        self._kept: dict[tuple[float, str], tuple[float, tuple[DailyArmCost, ...]]] = {}
        self._lock = threading.Lock()

    def series(self, days: int) -> DailyCost:
        """The last `days` UTC days up to now (today so far included), each priced on its own."""
        with self._lock:
            now = self._clock()
            today = math.floor(now / DAY_S) * DAY_S
            starts = [today - DAY_S * k for k in range(days - 1, -1, -1)]
            gpu_type, source = _gpu_type(self._engine, Window(starts[0], max(now, starts[0] + 1)), self._prices)
            self._kept = {key: kept for key, kept in self._kept.items() if key[0] > today - MAX_DAYS * DAY_S}
            rows = [row for start in starts if now > start for row in self._day(start, now, gpu_type)]
            return DailyCost(days, gpu_type, source, tuple(rows))

    def _day(self, start: float, now: float, gpu_type: str) -> tuple[DailyArmCost, ...]:
        kept = self._kept.get((start, gpu_type))
        if kept is not None and (kept[0] >= start + DAY_S + FINAL_AFTER_S or now - kept[0] < self._ttl_s):
            return kept[1]
        rows = price_day(self._engine, start, min(start + DAY_S, now), self._prices, gpu_type)
        self._kept[(start, gpu_type)] = (now, rows)
        return rows


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
        db: Engine,
        prices: Prices,
        *,
        registry: CollectorRegistry,
        window_s: float = 3600.0,
        ttl_s: float = 60.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._engine, self._prices = db, prices
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
            costs = sorted(arm_costs(self._engine, window, self._prices, gpu_type), key=lambda c: -c[1])
            return tuple((arm.key, arm.total_usd_per_mtok) for arm, _, _ in costs[:MAX_ARMS])
        except (ValueError, SQLAlchemyError) as exc:
            log.warning("%s not exported: the cost model failed: %s", GAUGE, exc)
            return ()
