"""`specwatch_acceptance_drift_score{instance,model,drafter,tag}` and
`specwatch_acceptance_regression_drop{instance,model,marker}` on /metrics, from the detectors' rows.

A prometheus_client collector; the service registers it with the leader-only gauges (every replica
reads the same rows). Labels are bounded: at most `max_series` drift series (alerts.baselines) and one
regression series per instance and model. The drift score is the CUSUM over its decision interval
(>= 1: a detected drop; 0 during a series' warmup); the regression drop is exported only when the
before/after test was significant.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from specwatch.alerts.detector_store import series_rows
from specwatch.alerts.signals import DRIFT_LABELS

log = logging.getLogger("specwatch.alerts")
DRIFT = ("specwatch_acceptance_drift_score", "Acceptance drop detector (CUSUM / decision interval; >= 1: a drop).")
REGRESSION = (
    "specwatch_acceptance_regression_drop",
    "1 - acceptance after / before the instance's latest config marker (significant drops only).",
)
REGRESSION_LABELS = ("instance", "model", "marker")


class DetectorGauges:
    def __init__(self, db: Engine, *, registry: CollectorRegistry) -> None:
        self._engine = db
        registry.register(self)

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(*DRIFT, labels=list(DRIFT_LABELS))
        yield GaugeMetricFamily(*REGRESSION, labels=list(REGRESSION_LABELS))

    def collect(self) -> Iterator[Metric]:
        try:
            yield self._family(DRIFT, "drift", DRIFT_LABELS, significant_only=False)
            yield self._family(REGRESSION, "regression", REGRESSION_LABELS, significant_only=True)
        except SQLAlchemyError as exc:  # a scrape must not fail because the store did
            log.warning("detector gauges: %s", exc)

    def _family(self, meta, kind: str, labels, significant_only: bool) -> GaugeMetricFamily:
        family = GaugeMetricFamily(*meta, labels=list(labels))
        for row in series_rows(self._engine, kind):
            if row.significant or not significant_only:
                values = dict(row.labels)
                family.add_metric([values.get(label, "none") for label in labels], row.value)
        return family
