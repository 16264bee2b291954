"""Alert state and history in SQL, so a restarted runner neither re-fires nor forgets.

`load_alerts` reads every rule's alerts back into evaluator `Alert`s; `save_rule` replaces one
rule's alerts and appends its transitions inside the caller's transaction. The read side
(`active_alerts`, `history`) serves `GET /v1/alerts` and `/v1/alerts/history`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass

from sqlalchemy import Connection, Engine, delete, insert, select

from alerts.evaluator import Alert, State, Transition
from collector.models import (
    AlertActionRow,
    AlertNotificationRow,
    AlertRuleHealthRow,
    AlertStateRow,
    AlertTransitionRow,
)
from collector.queries import Window

_ALERT_FIELDS = tuple(Alert.__dataclass_fields__)


def _to_row(alert: Alert) -> dict:
    row = asdict(alert)
    row["state"] = str(alert.state)
    return row


def _from_row(row) -> Alert:
    values = {f: getattr(row, f) for f in _ALERT_FIELDS}
    values["state"] = State[row.state.upper()]
    return Alert(**values)


def load_alerts(engine: Engine) -> dict[str, dict[str, Alert]]:
    """rule name -> fingerprint -> alert."""
    alerts: dict[str, dict[str, Alert]] = defaultdict(dict)
    with engine.connect() as conn:
        for row in conn.execute(select(AlertStateRow)):
            alerts[row.rule][row.fingerprint] = _from_row(row)
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
    conn.execute(delete(AlertStateRow).where(AlertStateRow.rule == rule))
    if alerts:
        conn.execute(insert(AlertStateRow), [_to_row(a) for a in alerts.values()])
    if transitions:
        conn.execute(
            insert(AlertTransitionRow),
            [{**asdict(t), "from_state": str(t.from_state), "to_state": str(t.to_state)} for t in transitions],
        )
    conn.execute(delete(AlertRuleHealthRow).where(AlertRuleHealthRow.rule == rule))
    conn.execute(
        insert(AlertRuleHealthRow).values(
            rule=rule, evaluated_at=evaluated_at, duration_s=duration_s, error=error and error[:1024]
        )
    )


@dataclass(frozen=True)
class AlertView:
    rule: str
    fingerprint: str
    state: str
    labels: dict[str, str]
    annotations: dict[str, str]
    value: float
    active_at: float
    fired_at: float | None
    resolved_at: float | None
    last_sent_at: float | None


@dataclass(frozen=True)
class RuleHealth:
    rule: str
    evaluated_at: float
    duration_s: float
    error: str | None


def active_alerts(engine: Engine, include_resolved: bool = False) -> tuple[list[AlertView], list[RuleHealth]]:
    """Pending and firing alerts (and recently resolved ones when asked), most severe state first."""
    with engine.connect() as conn:
        rows = conn.execute(select(AlertStateRow)).all()
        health = [
            RuleHealth(*r)
            for r in conn.execute(
                select(
                    AlertRuleHealthRow.rule,
                    AlertRuleHealthRow.evaluated_at,
                    AlertRuleHealthRow.duration_s,
                    AlertRuleHealthRow.error,
                ).order_by(AlertRuleHealthRow.rule)
            )
        ]
    views = [
        AlertView(**{f: getattr(r, f) for f in AlertView.__dataclass_fields__})
        for r in rows
        if include_resolved or r.state != "inactive"
    ]
    order = {"firing": 0, "pending": 1, "inactive": 2}
    return sorted(views, key=lambda v: (order[v.state], v.rule, -v.active_at)), health


def _rows(conn: Connection, table, window: Window, time_column, limit: int) -> list[dict]:
    columns = [c for c in table.__table__.columns if c.name != "payload"]
    stmt = select(*columns).where(time_column >= window.start, time_column < window.end)
    return [dict(row) for row in conn.execute(stmt.order_by(time_column.desc()).limit(limit)).mappings()]


def history(engine: Engine, window: Window, limit: int = 1000) -> dict[str, list[dict]]:
    """Transitions, remediation actions and webhook notifications in the window, newest first."""
    with engine.connect() as conn:
        return {
            "transitions": _rows(conn, AlertTransitionRow, window, AlertTransitionRow.at, limit),
            "actions": _rows(conn, AlertActionRow, window, AlertActionRow.at, limit),
            "notifications": _rows(conn, AlertNotificationRow, window, AlertNotificationRow.created_at, limit),
        }
