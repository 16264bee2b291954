"""The real-engine check of issue 27: the bundled model serves n-gram drafts, the control API switches its
default drafter to an untrained early exit mid-traffic (a `config` deploy marker), and the leader's cycle
fires SpecAcceptanceRegression naming that marker with before/after acceptance. (No per-request flag
here: anomalies are judged within a series, and a new drafter is a new series.)"""

from __future__ import annotations

import httpx
import pytest
from engine_harness import BackgroundServer

from alerts.rules import parse_config
from alerts.runner import AlertRunner
from alerts.store import active_alerts
from collector.store import Store
from engine.policy import PolicyConfig
from engine.scheduler import SchedulerConfig
from specwatch.workload import chat
from telemetry.schema import EngineEvent, IngestBatch

pytestmark = pytest.mark.slow
TOKEN = {"authorization": "Bearer s3cret"}
PER_SIDE = 12
RULE = {
    "name": "SpecAcceptanceRegression",
    "signal": "acceptance_regression",
    "op": ">=",
    "threshold": 0.1,
    "window": "6h",
    "min_samples": PER_SIDE - 2,
    "group_by": ["instance", "model", "marker"],
}
# the policy's cost lookahead soon drafts little with a drafter that is never accepted: count every draft
DETECTORS = {"regression": {"min_requests": PER_SIDE - 2, "min_drafted_tokens": 1}}


def serve(server: BackgroundServer, n: int) -> None:
    """`n` requests naming no drafter (the server's default), each copying a passage."""
    for i in range(n):
        server.client().chat.completions.create(
            model=None, messages=chat("grounded"), max_tokens=40, temperature=0, extra_body={"gamma": 4, "seed": i}
        )


def test_switching_to_an_untrained_early_exit_fires_the_regression_at_its_marker(bundled_engine, engine):
    events: list[EngineEvent] = []
    policy = PolicyConfig(min_acceptance=0.0)  # keep speculating on a bad drafter: the alert must see it
    with BackgroundServer(bundled_engine, SchedulerConfig(slots=1), policy, control_token="s3cret") as server:
        server.telemetry.subscribe(EngineEvent, events.append)
        mode = f"{server.url}/v1/control/mode"
        assert httpx.post(mode, json={"mode": "auto", "drafter": "ngram"}, headers=TOKEN).status_code == 200
        serve(server, PER_SIDE)
        assert httpx.post(mode, json={"mode": "auto", "drafter": "early-exit:4"}, headers=TOKEN).status_code == 200
        serve(server, PER_SIDE)
        records = server.records
    batch = {"requests": [r.model_dump() for r in records], "samples": [], "events": [e.model_dump() for e in events]}
    Store(engine).insert(IngestBatch.model_validate(batch))
    marker = [e for e in events if e.kind == "config"][-1]
    runner = AlertRunner(engine, parse_config({"rules": [RULE], "receivers": [], "detectors": DETECTORS}))
    runner.cycle(marker.at + 600)

    (alert,) = active_alerts(engine)[0]
    assert alert.state.value == "firing" and alert.labels["instance"] == marker.instance
    assert alert.labels["marker"] in alert.annotations["marker"] and alert.annotations["marker"].endswith(
        "(default_drafter: ngram -> early-exit:4; drafter: ngram -> early-exit:4)"
    )
    assert float(alert.annotations["before"]) > 0.3 > float(alert.annotations["after"])
    assert float(alert.annotations["p_value"]) < 0.01 and alert.annotations["drafters_after"] == "early-exit:4"
