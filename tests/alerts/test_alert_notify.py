"""The webhook outbox against a real local receiver: backoff, dead letter, label matching, Slack format."""

from __future__ import annotations

import json

import httpx
import pytest
from collector_payloads import T0, request_dict
from rule_dicts import acceptance_rule
from sqlalchemy import select
from webhook_receiver import Receiver

from specwatch.alerts.evaluator import Alert, State
from specwatch.alerts.notify import backoff_s, deliver_due, enqueue
from specwatch.alerts.rules import parse_config
from specwatch.alerts.runner import AlertRunner
from specwatch.alerts.signals import StoreSignals
from specwatch.alerts.tables import alert_notifications
from specwatch.collector.db import write_transaction
from specwatch.collector.ingest.store import Store
from specwatch.common.procs import free_port
from specwatch.telemetry.schema import IngestBatch


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


HOSTILE_DRAFTER = "model:<!channel><https://evil.example/login|Re-authenticate_now>"


def test_a_producer_string_reaches_slack_and_alertmanager_as_text(db):
    """Issue 53 #4: a drafter sent by a producer reached a Slack alert unescaped (an @channel ping and a
    disguised link). Its `&`, `<`, `>` now travel as entities in every annotation and Slack line."""
    low = dict(accepted_per_position=[1, 0, 0, 0], num_accepted_tokens=1, drafter=HOSTILE_DRAFTER)
    Store(db).insert(IngestBatch.model_validate({"requests": [request_dict(i, **low) for i in range(10)]}))
    summary = "acceptance {{ $value }} with {{ $labels.drafter }}"
    rule = acceptance_rule(**{"for": "0s"}, group_by=["instance", "drafter"], summary=summary)
    receivers = [
        {"name": "chat", "url": "http://127.0.0.1:9/", "format": "slack"},
        {"name": "am", "url": "http://127.0.0.1:9/"},
    ]
    config = parse_config({"rules": [rule], "receivers": receivers})
    AlertRunner(db, config, source=StoreSignals(db)).cycle(T0 + 20)
    slack, alertmanager = (row["payload"] for row in outbox(db))
    text = json.dumps(slack)
    assert "<!channel>" not in text and "<https://" not in text
    assert "&lt;!channel&gt;&lt;https://evil.example/login|Re-authenticate_now&gt;" in text
    (item,) = alertmanager["alerts"]
    assert item["labels"]["drafter"] == HOSTILE_DRAFTER  # labels are data, kept as sent
    assert "<" not in item["annotations"]["summary"] and "&lt;!channel&gt;" in item["annotations"]["summary"]
