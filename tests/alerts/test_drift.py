"""The change detectors through the real runner and store: SpecAcceptanceDrift on a series' own
baseline, SpecAcceptanceRegression at a deploy marker, state across a runner restart, webhooks.

Time is injected: records carry timestamps around T0 and every cycle gets an explicit `now`;
tables step through (t, value, expected state) without sleeps.
"""

from __future__ import annotations

import math

import pytest
from collector_payloads import T0, event_dict, request_dict
from prometheus_client import CollectorRegistry, generate_latest
from sqlalchemy import select

from specwatch.alerts.detector_gauges import DetectorGauges
from specwatch.alerts.detector_settings import DriftSettings
from specwatch.alerts.drift import SeriesState, run, step
from specwatch.alerts.rules import parse_config
from specwatch.alerts.runner import AlertRunner
from specwatch.alerts.store import active_alerts
from specwatch.alerts.tables import alert_notifications
from specwatch.collector.ingest.store import Store
from specwatch.telemetry.schema import IngestBatch

# the by-hand tables keep the warmup's baseline (learn_below_score 0); tests/alerts/test_drift_baseline.py learns
SMALL = {"warmup": 20, "decision_interval": 5.0, "min_drafted_tokens": 8, "rebaseline_after": 0, "learn_below_score": 0}
DRIFT_RULE = {
    "name": "SpecAcceptanceDrift",
    "signal": "acceptance_drift",
    "op": ">=",
    "threshold": 1,
    "window": "1h",
    "for": "30s",
    "min_samples": 0,
    "group_by": ["instance", "drafter", "tag"],
    "summary": "drift on {{ $labels.instance }}",
}
REGRESSION_RULE = {
    "name": "SpecAcceptanceRegression",
    "signal": "acceptance_regression",
    "op": ">=",
    "threshold": 0.1,
    "window": "6h",
    "min_samples": 10,
    "group_by": ["instance", "model", "marker"],
}
RECEIVER = {"name": "ops", "url": "http://127.0.0.1:9/hook"}


def config(rule: dict, **detectors):
    return parse_config({"rules": [rule], "receivers": [RECEIVER], "detectors": detectors})


def requests(start: int, count: int, accepted: int, drafter: str = "ngram", at0: float = T0) -> list[dict]:
    """`count` requests one second apart from `at0 + start`, each drafting 16 tokens and accepting `accepted`
    (per-request acceptance accepted / 16), tagged scenario=chat."""
    per_pos = [min(4, max(0, accepted - 4 * k)) for k in range(4)]
    per_pos = sorted(per_pos, reverse=True)
    return [
        request_dict(
            start + i,
            request_id=f"r-{drafter}-{start + i}",
            started_at=at0 + start + i,
            drafter=drafter,
            num_accepted_tokens=sum(per_pos),
            accepted_per_position=per_pos,
            tags={"scenario": "chat"},
        )
        for i in range(count)
    ]


def ingest(db, records=(), events=()) -> None:
    Store(db).insert(IngestBatch.model_validate({"requests": list(records), "samples": [], "events": list(events)}))


def increment(baseline: float, x: float, drafted: int = 16) -> float:
    """By hand: one request's CUSUM step after a constant baseline. z = √d·asin√x; the baseline's spread is
    0, so s is floored at min_stddev (0.02) · √d; the slack is half the mean change of z a -15% drop makes."""
    w, y0 = math.sqrt(drafted), math.asin(math.sqrt(baseline))
    s = 0.02 * w
    slack = w * (y0 - math.asin(math.sqrt(0.85 * baseline))) / (2 * s)
    return w * (y0 - math.asin(math.sqrt(x))) / s - slack


@pytest.mark.parametrize(
    ("xs", "expected"),
    [
        ([0.5] * 30, 0.0),  # stationary: the CUSUM stays at 0
        ([0.5] * 20 + [0.3] * 3, pytest.approx(3 * increment(0.5, 0.3) / 5)),
        ([0.5] * 20 + [0.3, 0.6], pytest.approx(max(0.0, increment(0.5, 0.3) + increment(0.5, 0.6)) / 5)),
    ],
)
def test_cusum_score_by_hand(xs, expected):
    assert increment(0.5, 0.6) < 0 < increment(0.5, 0.3)
    assert run(xs, DriftSettings(**SMALL))[-1] == expected


def test_alarm_then_recovery_then_rebaseline():
    settings = DriftSettings(**{**SMALL, "rebaseline_after": 5})  # baseline learning off: the table is by hand
    state = SeriesState()
    for i, x in enumerate([0.5, 0.7] * 10):  # baseline mean 0.6, sd ~0.1
        state = step(state, x, 16, i, settings)
    assert state.warmed_up(settings) is False and state.n == 20
    # each 0.2 adds 4 (0.888 - asin√0.2) / 0.422 - 0.373 / (2 · 0.422) = 3.58 to the CUSUM (m = 0.888 and s = 0.422
    # from asin√0.5 and asin√0.7, 16 drafted), over h = 5: the alarm comes with the second; 5 requests after it
    # the series starts a new baseline (no alarm standing)
    table = [(0.2, False), (0.2, True), (0.2, True), (0.2, True), (0.2, True), (0.2, True), (0.2, False)]
    for x, alarm in table:
        state = step(state, x, 16, 0, settings)
        assert (state.alarm_n is not None) == alarm
    assert state.n == 0


def test_drift_fires_resolves_and_survives_a_restart(db):
    cfg = config(DRIFT_RULE, drift=SMALL)
    ingest(db, requests(0, 40, accepted=12))  # acceptance 0.75: warmup (20) and in control
    table = [
        # (t, records added before the cycle, expected state of the alert)
        (60, [], None),
        (120, requests(40, 2, accepted=6), "pending"),  # 0.375: far below the baseline
        (180, [], "firing"),
        (240, requests(42, 40, accepted=12), "inactive"),  # recovered: the CUSUM is back at 0, resolved
        (300, [], "inactive"),  # kept resolved_retention so "resolved" is sent once
    ]
    runner = AlertRunner(db, cfg)
    for t, added, expected in table:
        ingest(db, added)
        if t == 180:  # a restarted runner resumes from the stored series and cursor (no new warmup)
            runner.close()
            runner = AlertRunner(db, cfg)
        runner.cycle(T0 + t)
        alerts, _ = active_alerts(db, include_resolved=True)
        assert (alerts[0].state.value if alerts else None) == expected, t
        if expected == "pending":
            assert alerts[0].labels == {
                "alertname": "SpecAcceptanceDrift",
                "severity": "warning",
                "instance": "gpu-0",
                "drafter": "ngram",
                "tag": "chat",
            }
            assert alerts[0].annotations["baseline"] == "0.750" and alerts[0].annotations["summary"] == "drift on gpu-0"
    with db.connect() as conn:
        sent = [row.alert_status for row in conn.execute(select(alert_notifications))]
    assert sent == ["firing", "resolved"]


def test_drift_score_on_metrics(db):
    cfg = config(DRIFT_RULE, drift=SMALL)
    ingest(db, requests(0, 20, accepted=12) + requests(20, 3, accepted=6))
    AlertRunner(db, cfg).cycle(T0 + 60)
    registry = CollectorRegistry()
    DetectorGauges(db, registry=registry)
    text = generate_latest(registry).decode()
    line = 'specwatch_acceptance_drift_score{drafter="ngram",instance="gpu-0",model="smollm2-135m",tag="chat"}'
    value = float(next(x for x in text.splitlines() if x.startswith(line)).split()[-1])
    assert value == pytest.approx(3 * increment(0.75, 0.375) / 5)


def test_untracked_series_past_max_series(db):
    cfg = config(DRIFT_RULE, drift={**SMALL, "max_series": 1})
    other = [{**r, "request_id": f"x{i}", "instance": "gpu-1"} for i, r in enumerate(requests(100, 5, accepted=8))]
    ingest(db, requests(0, 5, accepted=8) + other)
    from specwatch.alerts.baselines import run_pass

    done = run_pass(db, cfg.detectors.drift, T0 + 200)
    assert (done.read, done.fed, done.series, done.untracked) == (10, 5, 1, 5)


def test_regression_fires_at_the_marker_with_before_and_after(db):
    """n-gram drafts at ~0.75 until a config event switches the instance to an untrained early exit (~0.06)."""
    marker_at = T0 + 1000
    marker = event_dict(0, at=marker_at, kind="config", detail={"version": "0.9", "drafter": "early-exit:4"})
    earlier = event_dict(0, at=T0 - 86400, kind="config", detail={"version": "0.9", "drafter": "ngram"})
    before = requests(0, 40, accepted=12, at0=marker_at - 100)
    ingest(db, before, [earlier, marker])
    cfg = config(REGRESSION_RULE)
    runner = AlertRunner(db, cfg)
    table = [
        (1005, [], None),  # nothing after the marker yet
        (1020, requests(0, 5, accepted=1, drafter="early-exit:4", at0=marker_at + 1), None),  # 5 < min_samples
        (1100, requests(5, 30, accepted=1, drafter="early-exit:4", at0=marker_at + 1), "firing"),
    ]
    for t, added, expected in table:
        ingest(db, added)
        runner.cycle(T0 + t)
        alerts, _ = active_alerts(db)
        assert (alerts[0].state.value if alerts else None) == expected, t
    alert = alerts[0]
    assert alert.labels["marker"] == "2026-05-28T20:43:20Z" and alert.value == pytest.approx(1 - (1 / 16) / 0.75)
    notes = alert.annotations
    assert notes["marker"] == "2026-05-28T20:43:20Z (drafter: ngram → early-exit:4)"
    assert (notes["before"], notes["after"], notes["n_before"], notes["n_after"]) == ("0.750", "0.062", "40", "35")
    assert float(notes["p_value"]) < 1e-6 and notes["drafters_after"] == "early-exit:4"


def test_no_regression_when_acceptance_holds(db):
    marker_at = T0 + 1000
    ingest(db, requests(0, 40, accepted=12, at0=marker_at - 100), [event_dict(0, at=marker_at, kind="config")])
    after = [{**r, "request_id": f"a{i}"} for i, r in enumerate(requests(0, 40, accepted=12, at0=marker_at + 1))]
    ingest(db, after)
    AlertRunner(db, config(REGRESSION_RULE)).cycle(T0 + 1100)
    assert active_alerts(db)[0] == []
