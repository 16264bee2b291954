"""The webhook outbox against a real local receiver: backoff, dead letter, label matching, Slack format."""

from __future__ import annotations

import json

import httpx
import pytest
from sqlalchemy import select
from webhook_receiver import Receiver

from specwatch.alerts.evaluator import Alert, State
from specwatch.alerts.notify import backoff_s, deliver_due, enqueue
from specwatch.alerts.rules import parse_config
from specwatch.alerts.tables import alert_notifications
from specwatch.collector.db import write_transaction
from specwatch.common.procs import free_port


def alert(fp: str, severity: str, state: State = State.FIRING) -> Alert:
    labels = {"alertname": "TTFTP99High", "severity": severity, "instance": f"gpu-{fp}"}
    return Alert(
        "TTFTP99High", fp * 16, labels, {"summary": f"slow on gpu-{fp}"}, state, 0.42, 100.0, 100.0, fired_at=100.0
    )


def outbox(db) -> list[dict]:
    with db.connect() as conn:
        return [
            dict(r) for r in conn.execute(select(alert_notifications).order_by(alert_notifications.c.id)).mappings()
        ]


@pytest.fixture
def receiver():
    running = Receiver(free_port(), status=500)
    yield running
    running.close()


def test_failing_receiver_backs_off_then_dead_letters(db, receiver):
    url = f"http://127.0.0.1:{receiver.server.server_address[1]}/"
    config = parse_config({"receivers": [{"name": "ops", "url": url, "max_attempts": 3, "retry_backoff": "10s"}]})
    with write_transaction(db) as conn:
        assert enqueue(conn, config, "TTFTP99High", [alert("a", "critical")], 100.0, "http://collector") == 1
    with httpx.Client() as http:
        schedule = [
            (100.0, 1, "pending", 110.0),
            (105.0, 1, "pending", 110.0),
            (110.0, 2, "pending", 130.0),
            (130.0, 3, "dead", 130.0),
            (1000.0, 3, "dead", 130.0),
        ]
        for now, attempts, status, next_at in schedule:  # (now, attempts after, status after, next attempt at)
            assert deliver_due(db, config, http, now) == 0
            (row,) = outbox(db)
            assert (row["attempts"], row["status"], row["next_attempt_at"]) == (attempts, status, next_at), f"now={now}"
    assert row["last_error"].startswith("HTTP 500") and len(receiver.received) == 3
    keys = {headers["Idempotency-Key"] for headers, _ in receiver.received}
    assert keys == {row["key"]}  # retries repeat the idempotency key


def test_backoff_doubles_up_to_ten_minutes():
    assert [backoff_s(5.0, n) for n in (1, 2, 3, 4, 10)] == [5.0, 10.0, 20.0, 40.0, 600.0]


def test_receivers_get_only_matching_alerts_in_their_format(db):
    config = parse_config(
        {
            "receivers": [
                {"name": "pager", "url": "http://127.0.0.1:9/", "match": {"severity": "critical"}},
                {"name": "chat", "url": "http://127.0.0.1:9/", "format": "slack"},
            ]
        }
    )
    with write_transaction(db) as conn:
        sent = enqueue(
            conn, config, "TTFTP99High", [alert("a", "critical"), alert("b", "warning", State.INACTIVE)], 200.0, ""
        )
    assert sent == 2
    pager, chat = outbox(db)
    assert [a["labels"]["instance"] for a in pager["payload"]["alerts"]] == ["gpu-a"]
    assert pager["payload"]["commonLabels"] == {"alertname": "TTFTP99High", "severity": "critical", "instance": "gpu-a"}
    assert set(chat["payload"]) == {"text", "blocks"} and "[FIRING] TTFTP99High" in chat["payload"]["text"]
    assert "slow on gpu-a" in json.dumps(chat["payload"]["blocks"]) and "slow on gpu-b" in json.dumps(
        chat["payload"]["blocks"]
    )


def test_a_receiver_removed_from_the_config_dead_letters_its_backlog(db):
    config = parse_config({"receivers": [{"name": "old", "url": "http://127.0.0.1:9/"}]})
    with write_transaction(db) as conn:
        enqueue(conn, config, "TTFTP99High", [alert("a", "critical")], 100.0, "")
    with httpx.Client() as http:
        deliver_due(db, parse_config({}), http, 100.0)
    (row,) = outbox(db)
    assert (row["status"], row["last_error"]) == ("dead", "receiver no longer configured")
