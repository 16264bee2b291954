"""`specwatch_drafted_step_fraction{instance}`, `specwatch_speculation_inactive{instance}` and
`specwatch_speculation_last_draft_timestamp_seconds{instance}` on /metrics (collector.reads.speculation).

Store-derived (the same on every replica): the service registers it with the leader-only gauges. One
series per instance configured to speculate (bounded by the instances that send records, the scraped
sources and the config events of the last day). The fraction covers the last `window_s` seconds; an
instance without a decode step there exports no fraction and `inactive` 0. The answer is kept `ttl_s`
so scrapes in between reuse it; a failing query exports nothing.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from specwatch.collector.reads.queries import Window
from specwatch.collector.reads.speculation import Activity, speculation_activity

log = logging.getLogger("specwatch.collector")
FRACTION = ("specwatch_drafted_step_fraction", "Share of decode steps that drafted, over the speculation window.")
INACTIVE = (
    "specwatch_speculation_inactive",
    "1: configured to speculate, but fewer than the configured fraction of decode steps drafted.",
)
LAST_DRAFT = (
    "specwatch_speculation_last_draft_timestamp_seconds",
    "When the instance last drafted (epoch s; absent: no draft within a day).",
)


class SpeculationGauges:
    def __init__(
        self,
        db: Engine,
        *,
        registry: CollectorRegistry,
        window_s: float,
        min_fraction: float,
        ttl_s: float = 10.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._db, self._window_s, self._min_fraction, self._ttl_s, self._clock = (
            db,
            window_s,
            min_fraction,
            ttl_s,
            clock,
        )
        self._lock = threading.Lock()
        self._measured_at: float | None = None
        self._values: list[Activity] = []
        registry.register(self)

    def describe(self) -> Iterator[Metric]:
        for meta in (FRACTION, INACTIVE, LAST_DRAFT):
            yield GaugeMetricFamily(*meta, labels=["instance"])

    def collect(self) -> Iterator[Metric]:
        fraction, inactive, last = (
            GaugeMetricFamily(*meta, labels=["instance"]) for meta in (FRACTION, INACTIVE, LAST_DRAFT)
        )
        for a in self._current():
            if a.drafted_step_fraction is not None:
                fraction.add_metric([a.instance], a.drafted_step_fraction)
            inactive.add_metric([a.instance], float(a.inactive))
            if a.last_drafted_at is not None:
                last.add_metric([a.instance], a.last_drafted_at)
        yield from (fraction, inactive, last)

    def _current(self) -> list[Activity]:
        with self._lock:
            now = self._clock()
            if self._measured_at is None or now - self._measured_at >= self._ttl_s:
                try:
                    self._values = speculation_activity(self._db, Window(now - self._window_s, now), self._min_fraction)
                except SQLAlchemyError as exc:  # a scrape must not fail because the store did
                    log.warning("speculation gauges: %s", exc)
                    self._values = []
                self._measured_at = now
            return self._values
