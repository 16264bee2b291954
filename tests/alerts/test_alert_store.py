"""The alert store's reads: active alerts (one `Alert` type, most severe first) and the incident history
the cost model reads."""

from __future__ import annotations

from specwatch.alerts.evaluator import Alert, State, Transition
from specwatch.alerts.store import active_alerts, incident_history, save_rule
from specwatch.alerts.tables import alert_actions
from specwatch.collector.db import write_transaction
from specwatch.collector.reads.queries import Window


def _alert(fp: str, state: State, at: float) -> Alert:
    return Alert("R", fp, {"instance": fp}, {}, state, 0.5, at, at)


def test_active_alerts_are_alerts_most_severe_first(db):
    alerts = {fp: _alert(fp, state, 1.0) for fp, state in (("a", State.PENDING), ("b", State.FIRING))}
    alerts["c"] = _alert("c", State.INACTIVE, 1.0)
    with write_transaction(db) as conn:
        save_rule(conn, "R", alerts, [], 2.0, 0.01, None)
    shown, health = active_alerts(db)
    assert [(a.fingerprint, a.state) for a in shown] == [("b", State.FIRING), ("a", State.PENDING)]
    assert shown[0] == alerts["b"] and isinstance(shown[0].state, State)
    assert [a.fingerprint for a in active_alerts(db, include_resolved=True)[0]] == ["b", "a", "c"]
    assert [(h.rule, h.evaluated_at) for h in health] == [("R", 2.0)]


def test_incident_history_holds_changes_up_to_the_window_end_and_actions_inside(db):
    def move(at: float, to: State) -> Transition:
        return Transition(at, "R", "f", {}, State.PENDING, to, 0.5)

    with write_transaction(db) as conn:
        changes = [move(50.0, State.FIRING), move(150.0, State.INACTIVE), move(250.0, State.FIRING)]
        save_rule(conn, "R", {}, changes, 0, 0, None)
        conn.execute(
            alert_actions.insert(),
            [
                {"at": at, "rule": "R", "fingerprint": "f", "action": "defragment", "outcome": "ok", "detail": {}}
                for at in (90.0, 120.0, 210.0)
            ],
        )
    found = incident_history(db, Window(100.0, 200.0))
    assert found.transitions == (("f", 50.0, "firing"), ("f", 150.0, "inactive"))
    assert found.actions == 1
