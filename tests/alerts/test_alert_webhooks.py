"""End to end, on a timeline: a real collector process ingests telemetry whose acceptance drops
below 0.6; the alert runner is stepped through `cycle(now)` and `deliver(now)` at explicit times
(no sleeps), against a real local webhook receiver that is down at first. The alert goes pending,
fires and resolves; once the receiver is up the outbox delivers both notifications, each exactly
once, signed."""

from __future__ import annotations

import hashlib
import hmac
import json
import time

import httpx
from collector_payloads import request_dict
from rule_dicts import acceptance_rule
from webhook_receiver import Receiver

from specwatch.alerts.notify import SIGNATURE_HEADER, sign
from specwatch.alerts.rules import AlertConfig, parse_config
from specwatch.alerts.runner import AlertRunner
from specwatch.collector.db import make_db
from specwatch.common import procs
from specwatch.common.procs import free_port
from specwatch.telemetry.client import TelemetryClient
from specwatch.telemetry.schema import RequestRecord

SECRET = "webhook-s3cret"
RECEIVER_UP_AT = 1.7
# (t, accepted tokens of 16 in 10 requests started at t - 0.1 (None: no traffic),
#  the alert's state after cycle(t), notifications at the receiver after deliver(t))
TIMELINE = [
    (0.0, 14, "inactive", 0),  # acceptance 0.875
    (0.5, 3, "pending", 0),  # with the first ten: (140 + 30) / 320 = 0.53 < 0.6
    (1.0, None, "pending", 0),  # not yet pending for 1 s
    (1.5, None, "firing", 0),  # the receiver is down: the first attempt fails, retried after 0.5 s
    (1.8, None, "firing", 0),  # the receiver is up, the retry not due yet
    (2.0, None, "firing", 1),  # the retry delivers "firing"
    (6.0, None, "firing", 1),  # the good requests left the 6 s window, the bad ones have not: 3 / 16
    (7.0, 15, "inactive", 2),  # only the new requests in the window: 0.94, resolved and sent
    (7.5, None, "inactive", 2),
    (20.0, None, "inactive", 2),  # nothing else is sent
]


def send(client: TelemetryClient, start: int, accepted: int, at: float, n: int = 10) -> None:
    """n requests started at `at`, each 4 drafts of 4 tokens with `accepted` tokens accepted."""
    per_pos = [sum(1 for d in range(4) if min(4, max(0, accepted - 4 * d)) > k) for k in range(4)]
    for i in range(start, start + n):
        client.submit_request(
            RequestRecord.model_validate(
                request_dict(
                    i,
                    request_id=f"e2e-{i}",
                    started_at=at,
                    num_drafts=4,
                    num_draft_tokens=16,
                    num_accepted_tokens=accepted,
                    accepted_per_position=per_pos,
                )
            )
        )
    assert client.flush(10)  # acknowledged: stored


def alert_config(receiver_url: str) -> AlertConfig:
    return parse_config(
        {
            "rules": [
                acceptance_rule(
                    window="6s",
                    **{"for": "1s"},
                    severity="warning",
                    summary="acceptance {{ $value }} on {{ $labels.instance }}",
                )
            ],
            "receivers": [
                {
                    "name": "ops",
                    "url": receiver_url,
                    "secret_env": "SPECWATCH_TEST_WEBHOOK_SECRET",
                    "retry_backoff": "0.5s",
                    "max_attempts": 100,
                }
            ],
        }
    )


def alert_state(api: str) -> str:
    alerts = httpx.get(f"{api}/v1/alerts", params={"include_resolved": True}).json()["alerts"]
    assert len(alerts) <= 1, alerts
    if alerts:
        assert alerts[0]["labels"] == {"alertname": "SpecAcceptanceLow", "severity": "warning", "instance": "gpu-0"}
    return alerts[0]["state"] if alerts else "inactive"


def test_alert_fires_and_resolves_through_a_receiver_that_was_down(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECWATCH_TEST_WEBHOOK_SECRET", SECRET)
    collector_port, receiver_port = free_port(), free_port()
    db_url = f"sqlite:///{tmp_path / 'db.sqlite'}"
    # the collector ingests and serves the alert API; this test is its alert runner
    collector = procs.start_collector(
        collector_port, tmp_path / "collector.log", db_url, {"SPECWATCH_ALERTS_ENABLED": "false"}
    )
    api = f"http://127.0.0.1:{collector_port}"
    db = make_db(db_url)
    runner = AlertRunner(db, alert_config(f"http://127.0.0.1:{receiver_port}/hook"), external_url=api)
    t0, receiver = time.time() - 60, None  # the timeline ends before the wall clock: no records from the future
    try:
        with TelemetryClient(api, flush_interval_s=0.05) as client:
            for step, (t, accepted, state, received) in enumerate(TIMELINE):
                if receiver is None and t >= RECEIVER_UP_AT:
                    receiver = Receiver(receiver_port)
                if accepted is not None:
                    send(client, 100 * step, accepted, at=t0 + t - 0.1)
                runner.cycle(t0 + t)
                runner.deliver(t0 + t)
                got = (alert_state(api), len(receiver.received) if receiver else 0)
                assert got == (state, received), f"at t={t}"
                if t == 1.5:
                    (failed,) = httpx.get(f"{api}/v1/alerts/history").json()["notifications"]
                    assert failed["attempts"] == 1 and failed["status"] == "pending"
                    assert "ConnectError" in failed["last_error"]
    finally:
        runner.close()
        db.dispose()
        collector.terminate()
        collector.wait(30)
        if receiver:
            receiver.close()
    check_deliveries(receiver.received, api)


def check_deliveries(received: list[tuple[dict, bytes]], external_url: str) -> None:
    assert len(received) == 2, [json.loads(b)["status"] for _, b in received]
    payloads = [json.loads(body) for _, body in received]
    assert [p["status"] for p in payloads] == ["firing", "resolved"]
    keys = [headers["Idempotency-Key"] for headers, _ in received]
    assert len(set(keys)) == 2
    for headers, body in received:
        assert hmac.compare_digest(headers[SIGNATURE_HEADER], sign(SECRET, body))
        assert headers[SIGNATURE_HEADER] == "sha256=" + hmac.new(SECRET.encode(), body, hashlib.sha256).hexdigest()
    firing, resolved = payloads
    assert set(firing) == {
        "version",
        "groupKey",
        "truncatedAlerts",
        "status",
        "receiver",
        "groupLabels",
        "commonLabels",
        "commonAnnotations",
        "externalURL",
        "alerts",
    }
    assert (firing["version"], firing["receiver"], firing["groupLabels"]) == (
        "4",
        "ops",
        {"alertname": "SpecAcceptanceLow"},
    )
    assert firing["externalURL"] == external_url
    (alert,) = firing["alerts"]
    assert set(alert) == {"status", "labels", "annotations", "startsAt", "endsAt", "generatorURL", "fingerprint"}
    assert alert["endsAt"] == "0001-01-01T00:00:00Z" and alert["annotations"]["summary"].startswith("acceptance 0.53")
    (gone,) = resolved["alerts"]
    assert (
        gone["status"] == "resolved"
        and gone["fingerprint"] == alert["fingerprint"]
        and gone["endsAt"] > gone["startsAt"]
    )
