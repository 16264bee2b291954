"""Remediation against the real engine: the bundled model drafting with an untrained early exit
(acceptance of a few percent, the realistic bad draft) trips SpecAcceptanceLow; its
`fallback_autoregressive` action switches the running engine to plain decoding through the
control API, and resolving the alert restores speculation."""

from __future__ import annotations

import time

import httpx
import pytest
from engine_harness import BackgroundServer
from rule_dicts import acceptance_rule
from sqlalchemy import select

from specwatch.alerts.evaluator import Alert, State
from specwatch.alerts.rules import parse_config
from specwatch.alerts.runner import AlertRunner
from specwatch.alerts.tables import alert_actions
from specwatch.collector.db import make_db, upgrade
from specwatch.collector.ingest.store import Store
from specwatch.engine.policy import PolicyConfig
from specwatch.engine.scheduler import SchedulerConfig
from specwatch.telemetry.schema import IngestBatch

TOKEN_ENV = "SPECWATCH_TEST_CONTROL_TOKEN"


@pytest.fixture
def db(tmp_path):
    db = make_db(f"sqlite:///{tmp_path / 'alerts.db'}")
    upgrade(db)
    yield db
    db.dispose()


def config_for(engine_url: str):
    return parse_config(
        {
            "rules": [
                acceptance_rule(
                    **{"for": "0s"},
                    min_samples=3,
                    group_by=["instance", "drafter"],
                    actions=["recommend_draft_retraining", "fallback_autoregressive"],
                )
            ],
            "remediation": {"cooldown": "90s", "token_env": TOKEN_ENV, "engines": {"*": engine_url}},
        }
    )


def complete(url: str, prompt: str) -> None:
    body = {"prompt": prompt, "max_tokens": 12, "temperature": 0, "drafter": "early-exit:2", "gamma": 4}
    assert httpx.post(f"{url}/v1/completions", json=body, timeout=120).status_code == 200


def state(url: str) -> dict:
    return httpx.get(f"{url}/v1/control/state", headers={"Authorization": "Bearer tok"}).json()


def test_low_acceptance_falls_back_and_restores_on_the_real_engine(bundled_engine, db, monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, "tok")
    # (the engine's own policy may stop drafting for some of them after seeing the acceptance)
    prompts = [f"Write a sentence about the number {n}." for n in range(6)]
    with BackgroundServer(
        bundled_engine, SchedulerConfig(slots=2, max_queue=8), PolicyConfig(), control_token="tok"
    ) as server:
        for prompt in prompts:
            complete(server.url, prompt)
        Store(db).insert(IngestBatch(requests=server.records))
        runner = AlertRunner(db, config_for(server.url))
        now = time.time() + 1
        report = runner.cycle(now)
        assert [(t.from_state, t.to_state) for t in report.transitions] == [
            (State.INACTIVE, State.PENDING),
            (State.PENDING, State.FIRING),
        ]
        assert [(a.action, a.outcome) for a in report.actions] == [
            ("recommend_draft_retraining", "recommended"),
            ("fallback_autoregressive", "ok"),
        ]
        assert (state(server.url)["override"], state(server.url)["override_reason"]) == ("autoregressive", "alert")
        complete(server.url, "One more, please.")
        assert (server.records[-1].mode, server.records[-1].mode_reason) == ("autoregressive", "alert")

        alert = next(iter(report.transitions))
        again = runner.remediator.run("fallback_autoregressive", _alert(alert), now + 30)
        assert again.outcome == "cooldown"

        report = runner.cycle(now + 400)  # the bad requests left the window: resolved
        assert [(a.action, a.outcome) for a in report.actions] == [("restore_speculative", "ok")]
        assert state(server.url)["override"] == "auto"

        monkeypatch.setenv(TOKEN_ENV, "wrong")
        refused = runner.remediator.run("defragment", _alert(alert), now + 500)
        assert (refused.outcome, refused.detail["status"]) == ("failed", 401)
        runner.close()
    with db.connect() as conn:
        recorded = conn.execute(
            select(alert_actions.c.action, alert_actions.c.outcome).order_by(alert_actions.c.id)
        ).all()
    assert [tuple(r) for r in recorded] == [
        ("recommend_draft_retraining", "recommended"),
        ("fallback_autoregressive", "ok"),
        ("fallback_autoregressive", "cooldown"),
        ("restore_speculative", "ok"),
        ("defragment", "failed"),
    ]


def _alert(transition) -> Alert:
    return Alert(
        transition.rule,
        transition.fingerprint,
        transition.labels,
        {},
        State.FIRING,
        transition.value,
        transition.at,
        transition.at,
    )


def test_an_unreachable_or_unknown_engine_is_recorded_not_raised(db):
    config = parse_config({"remediation": {"engines": {"gpu-1": "http://127.0.0.1:9"}}})
    runner = AlertRunner(db, config)
    alert = Alert("R", "f" * 16, {"instance": "gpu-1"}, {}, State.FIRING, 0.1, 0.0, 0.0)
    assert runner.remediator.run("unload_draft", alert, 1.0).outcome == "failed"
    other = Alert("R", "e" * 16, {"instance": "gpu-2"}, {}, State.FIRING, 0.1, 0.0, 0.0)
    assert runner.remediator.run("unload_draft", other, 1.0).outcome == "no_engine"
    runner.close()


def test_rebalance_streams_on_a_cpu_engine_is_recorded_not_applicable(bundled_engine, db, monkeypatch):
    monkeypatch.setenv(TOKEN_ENV, "tok")
    with BackgroundServer(
        bundled_engine, SchedulerConfig(slots=1, max_queue=1), PolicyConfig(), control_token="tok"
    ) as server:
        runner = AlertRunner(db, config_for(server.url))
        alert = Alert("DraftUtilizationSwing", "d" * 16, {"instance": "test"}, {}, State.FIRING, 45.0, 0.0, 0.0)
        result = runner.remediator.run("rebalance_streams", alert, 1.0)
        runner.close()
    assert (result.outcome, result.detail["status"]) == ("not_applicable", 409)
    assert result.detail["url"].endswith("/v1/control/streams")
    assert "device cpu has no CUDA streams" in result.detail["response"]["error"]["message"]
    with db.connect() as conn:
        recorded = conn.execute(select(alert_actions.c.action, alert_actions.c.outcome)).all()
    assert [tuple(r) for r in recorded] == [("rebalance_streams", "not_applicable")]


def test_rebalance_streams_asks_for_target_high_draft_low(db):
    from specwatch.alerts.actions import Remediator

    sent = []

    def engine_api(request: httpx.Request) -> httpx.Response:
        sent.append((request.url.path, request.headers.get("authorization"), request.content))
        return httpx.Response(
            200, json={"action": "streams", "before": {"target_priority": 0}, "after": {"target_priority": -5}}
        )

    config = parse_config({"remediation": {"engines": {"*": "http://gpu-1:8000"}}})
    with httpx.Client(transport=httpx.MockTransport(engine_api)) as http:
        remediator = Remediator(db, config.remediation, http)
        alert = Alert("DraftUtilizationSwing", "c" * 16, {"instance": "gpu-1"}, {}, State.FIRING, 45.0, 0.0, 0.0)
        done = remediator.run("rebalance_streams", alert, 10.0)
        again = remediator.run("rebalance_streams", alert, 20.0)
    assert (done.outcome, done.detail["response"]["after"]["target_priority"]) == ("ok", -5)
    assert again.outcome == "cooldown"
    assert [(path, body) for path, _, body in sent] == [("/v1/control/streams", b'{"target":"high","draft":"low"}')]
