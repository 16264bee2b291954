"""Canary verdicts (`canary_verdict` events) become alert history, a remediation-action row and an
Alertmanager notification in the leader's cycle, once each; both stores."""

from __future__ import annotations

from collector_payloads import T0
from sqlalchemy import select

from specwatch.alerts import canary
from specwatch.alerts.rules import parse_config
from specwatch.alerts.runner import AlertRunner
from specwatch.alerts.store import history
from specwatch.alerts.tables import alert_notifications
from specwatch.collector.ingest.store import Store
from specwatch.collector.reads.queries import Window
from specwatch.telemetry.schema import IngestBatch

CONFIG = parse_config(
    {
        "rules": [],
        "receivers": [
            {"name": "ops", "url": "http://127.0.0.1:9/hook"},
            {"name": "pager", "url": "http://127.0.0.1:9/page", "match": {"severity": "critical"}},
        ],
    }
)


def verdict(at: float, decision: str, speedup: float, p: float, applied: bool = True) -> dict:
    detail = {
        "decision": decision,
        "reason": f"{decision} because p={p}",
        "p_value": p,
        "speedup": speedup,
        "candidate": {"requests": 30, "errors": 0, "ms_per_token": 20.0 / speedup},
        "control": {"requests": 31, "errors": 1, "ms_per_token": 20.0},
        "share": {"from": 0.05, "to": 1.0 if decision == "promote" else 0.0},
        "applied": applied,
        "alpha": 0.05,
    }
    return {"instance": "edge", "at": at, "kind": "canary_verdict", "detail": detail}


def ingest(db, events: list[dict]) -> None:
    Store(db).insert(IngestBatch.model_validate({"requests": [], "samples": [], "events": events}))


def payloads(db) -> list[dict]:
    with db.connect() as conn:
        return list(conn.scalars(select(alert_notifications.c.payload).order_by(alert_notifications.c.id)))


def test_each_verdict_is_one_history_entry_action_and_webhook(db):
    ingest(db, [verdict(T0, "promote", 1.8, 0.001), verdict(T0 + 60, "rollback", 0.7, 0.002, applied=False)])
    AlertRunner(db, CONFIG).cycle(T0 + 90)
    AlertRunner(db, CONFIG).cycle(T0 + 120)  # a second cycle (a new leader too) repeats nothing
    found = history(db, Window(T0 - 10, T0 + 200))
    transitions = sorted(found["transitions"], key=lambda t: t["at"])
    assert [(t["rule"], t["labels"]["decision"], t["to_state"]) for t in transitions] == [
        ("CanaryVerdict", "promote", "firing"),
        ("CanaryVerdict", "rollback", "firing"),
    ]
    assert [t["value"] for t in transitions] == [1.8, 0.7]
    actions = sorted(found["actions"], key=lambda a: a["at"])
    assert [(a["action"], a["outcome"], a["instance"]) for a in actions] == [
        ("canary_promote", "ok", "edge"),
        ("canary_rollback", "failed", "edge"),
    ]
    sent = payloads(db)  # only `ops` wants them: `pager` matches severity critical
    assert [p["receiver"] for p in sent] == ["ops", "ops"]
    promote, rollback = (p["alerts"][0] for p in sent)
    assert promote["labels"]["severity"] == "info" and rollback["labels"]["severity"] == "warning"
    assert sent[0]["version"] == "4" and sent[0]["groupLabels"] == {"alertname": "CanaryVerdict"}
    assert promote["annotations"]["summary"] == "canary on edge: promote (speed-up 1.8x, p=0.001, alpha 0.05)"
    assert promote["annotations"]["before"] == "control: 20 ms/token, 31 requests"
    assert rollback["annotations"]["share"] == "0.05 -> 0.0 (refused)"


def test_a_verdict_older_than_the_lookback_is_not_sent(db):
    ingest(db, [verdict(T0, "promote", 1.5, 0.01)])
    assert canary.run_pass(db, CONFIG, T0 + canary.LOOKBACK_S + 61) == 0
    assert canary.run_pass(db, CONFIG, T0 + 30) == 1
    assert canary.run_pass(db, CONFIG, T0 + 31) == 0
