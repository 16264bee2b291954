"""Alert state and history in SQL (the tables of `alerts.tables`), so a restarted runner neither
re-fires nor forgets.

`load_alerts` reads every rule's alerts back into evaluator `Alert`s; `save_rule` replaces one
rule's alerts and appends its transitions inside the caller's transaction. The read side
(`active_alerts`, `history`) serves `GET /v1/alerts` and `/v1/alerts/history`; `incident_history`
is what the cost model's incident estimate reads.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass

from sqlalchemy import Connection, Engine, Table, delete, func, insert, select

from specwatch.alerts.evaluator import Alert, State, Transition
from specwatch.alerts.tables import (
    alert_actions,
    alert_notifications,
    alert_rule_health,
    alert_states,
    alert_transitions,
)
from specwatch.collector.reads.queries import Window

_ALERT_FIELDS = tuple(Alert.__dataclass_fields__)


def _from_row(row) -> Alert:
    values = {f: getattr(row, f) for f in _ALERT_FIELDS}
    return Alert(**{**values, "state": State(row.state)})


def _read_alerts(conn: Connection) -> list[Alert]:
    return [_from_row(row) for row in conn.execute(select(alert_states))]


def load_alerts(db: Engine) -> dict[str, dict[str, Alert]]:
    """rule name -> fingerprint -> alert."""
    alerts: dict[str, dict[str, Alert]] = defaultdict(dict)
    with db.connect() as conn:
        for alert in _read_alerts(conn):
            alerts[alert.rule][alert.fingerprint] = alert
    return alerts


def save_rule(
    conn: Connection,
    rule: str,
    alerts: dict[str, Alert],
    transitions: list[Transition],
    evaluated_at: float,
    duration_s: float,
    error: str | None,
) -> None:
    conn.execute(delete(alert_states).where(alert_states.c.rule == rule))
    if alerts:
        conn.execute(insert(alert_states), [asdict(a) for a in alerts.values()])
    if transitions:
        conn.execute(insert(alert_transitions), [asdict(t) for t in transitions])
    conn.execute(delete(alert_rule_health).where(alert_rule_health.c.rule == rule))
    health = {"evaluated_at": evaluated_at, "duration_s": duration_s, "error": error and error[:1024]}
    conn.execute(insert(alert_rule_health).values(rule=rule, **health))


@dataclass(frozen=True)
class RuleHealth:
    rule: str
    evaluated_at: float
    duration_s: float
    error: str | None


def active_alerts(db: Engine, include_resolved: bool = False) -> tuple[list[Alert], list[RuleHealth]]:
    """Pending and firing alerts (and recently resolved ones when asked), most severe state first."""
    with db.connect() as conn:
        alerts = _read_alerts(conn)
        health = [RuleHealth(*r) for r in conn.execute(select(alert_rule_health).order_by(alert_rule_health.c.rule))]
    shown = [a for a in alerts if include_resolved or a.state != State.INACTIVE]
    return sorted(shown, key=lambda a: (-a.state.rank, a.rule, -a.active_at)), health


def _rows(conn: Connection, table: Table, window: Window, time_column: str, limit: int) -> list[dict]:
    at = table.c[time_column]
    stmt = select(*(c for c in table.c if c.name != "payload")).where(at >= window.start, at < window.end)
    rows = conn.execute(stmt.order_by(at.desc()).limit(limit)).mappings()
    return [{str(k): v for k, v in row.items()} for row in rows]  # str: `key` comes back as a quoted_name


def history(db: Engine, window: Window, limit: int = 1000) -> dict[str, list[dict]]:
    """Transitions, remediation actions and webhook notifications in the window, newest first."""
    with db.connect() as conn:
        return {
            "transitions": _rows(conn, alert_transitions, window, "at", limit),
            "actions": _rows(conn, alert_actions, window, "at", limit),
            "notifications": _rows(conn, alert_notifications, window, "created_at", limit),
        }


@dataclass(frozen=True)
class IncidentHistory:
    """What incident time is estimated from: every alert's state changes up to the window's end (oldest
    first, so an alert firing since before the window counts from the window's start) and the number of
    remediation actions inside the window."""

    transitions: tuple[tuple[str, float, str], ...]  # (fingerprint, at, to_state), oldest first
    actions: int


def incident_history(db: Engine, window: Window) -> IncidentHistory:
    t, a = alert_transitions.c, alert_actions.c
    with db.connect() as conn:
        changes = conn.execute(select(t.fingerprint, t.at, t.to_state).where(t.at < window.end).order_by(t.at))
        found = tuple((str(fp), float(at), str(to)) for fp, at, to in changes)
        actions = conn.scalar(select(func.count()).where(a.at >= window.start, a.at < window.end))
    return IncidentHistory(found, int(actions or 0))


def expire_history(conn: Connection, cutoff: float) -> int:
    """Forget history older than `cutoff` (the collector's retention pass calls it in its transaction,
    with the rollups' cutoff: post-mortems read alert history as long as they read rollups); a pending
    notification is kept whatever its age. Returns the rows deleted."""
    return (
        conn.execute(delete(alert_transitions).where(alert_transitions.c.at < cutoff)).rowcount
        + conn.execute(delete(alert_actions).where(alert_actions.c.at < cutoff)).rowcount
        + conn.execute(
            delete(alert_notifications).where(
                alert_notifications.c.created_at < cutoff, alert_notifications.c.status != "pending"
            )
        ).rowcount
    )
