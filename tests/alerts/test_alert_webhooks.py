"""End to end: a real collector process, telemetry whose acceptance drops below 0.6, and a
real local webhook receiver that is down at first. The alert fires and resolves; once the
receiver is up the outbox delivers both notifications, each exactly once, signed."""

from __future__ import annotations

import hashlib
import hmac
import json
import time
from pathlib import Path

import httpx
import yaml
from collector_payloads import request_dict
from waiting import wait_for
from webhook_receiver import Receiver

from alerts.notify import SIGNATURE_HEADER, sign
from collector.client import TelemetryClient
from collector.schema import RequestRecord
from specwatch import common
from specwatch.common import free_port

SECRET = "webhook-s3cret"


def rules_file(tmp_path: Path, receiver_url: str) -> Path:
    path = tmp_path / "rules.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "evaluation": {"interval": "0.3s"},
                "rules": [
                    {
                        "name": "SpecAcceptanceLow",
                        "signal": "acceptance_rate",
                        "op": "<",
                        "threshold": 0.6,
                        "window": "6s",
                        "for": "1s",
                        "min_samples": 5,
                        "group_by": ["instance"],
                        "severity": "warning",
                        "summary": "acceptance {{ $value }} on {{ $labels.instance }}",
                    }
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
    )
    return path


def send(client: TelemetryClient, start: int, accepted: int, n: int = 10) -> None:
    """n requests now, each 4 drafts of 4 tokens with `accepted` tokens accepted."""
    per_pos = [sum(1 for d in range(4) if min(4, max(0, accepted - 4 * d)) > k) for k in range(4)]
    for i in range(start, start + n):
        client.submit_request(
            RequestRecord.model_validate(
                request_dict(
                    i,
                    request_id=f"e2e-{i}",
                    started_at=time.time(),
                    num_drafts=4,
                    num_draft_tokens=16,
                    num_accepted_tokens=accepted,
                    accepted_per_position=per_pos,
                )
            )
        )
    assert client.flush(10)


def test_alert_fires_and_resolves_through_a_receiver_that_was_down(tmp_path):
    collector_port, receiver_port = free_port(), free_port()
    receiver_url = f"http://127.0.0.1:{receiver_port}/hook"
    env = {
        "SPECWATCH_ALERT_RULES": str(rules_file(tmp_path, receiver_url)),
        "SPECWATCH_TEST_WEBHOOK_SECRET": SECRET,
        "SPECWATCH_EXTERNAL_URL": f"http://127.0.0.1:{collector_port}",
    }
    collector = common.start_collector(
        collector_port, tmp_path / "collector.log", f"sqlite:///{tmp_path / 'db.sqlite'}", env
    )
    api = f"http://127.0.0.1:{collector_port}"
    receiver = None
    try:
        with TelemetryClient(api, flush_interval_s=0.1) as client:
            send(client, 0, accepted=14)  # acceptance 0.875
            send(client, 100, accepted=3)  # together: (140 + 30) / 320 = 0.53 < 0.6
            firing = wait_for(
                lambda: [a for a in httpx.get(f"{api}/v1/alerts").json()["alerts"] if a["state"] == "firing"],
                "the alert to fire",
            )
            assert firing[0]["labels"] == {"alertname": "SpecAcceptanceLow", "severity": "warning", "instance": "gpu-0"}
            failed = wait_for(
                lambda: [
                    n
                    for n in httpx.get(f"{api}/v1/alerts/history").json()["notifications"]
                    if n["attempts"] >= 1 and n["status"] == "pending"
                ],
                "a failed delivery attempt",
            )
            assert "ConnectError" in failed[0]["last_error"]

            receiver = Receiver(receiver_port)
            wait_for(lambda: len(receiver.received) >= 1, "the firing notification")
            time.sleep(6.5)  # the bad requests leave the 6 s window
            send(client, 200, accepted=15)  # acceptance 0.94: resolves
            wait_for(lambda: len(receiver.received) >= 2, "the resolved notification")
        time.sleep(2.0)  # nothing else may arrive
    finally:
        collector.terminate()
        collector.wait(30)
        if receiver:
            receiver.close()
    check_deliveries(receiver.received, f"http://127.0.0.1:{collector_port}")


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
