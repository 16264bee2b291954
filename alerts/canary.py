"""Canary verdicts into alert history and webhooks: the leader's pass over `canary_verdict` events.

`specwatch tune canary` decides (promote or roll back), acts on the gateway, and records its verdict as a
`canary_verdict` event through the ingest API. Each cycle, this pass reads the verdicts of the last
`LOOKBACK_S` and, for each one not yet in the history, writes in one transaction:

- an `alert_transitions` row (rule `CanaryVerdict`, inactive -> firing, value: the measured speed-up),
- an `alert_actions` row (`canary_promote` | `canary_rollback`, outcome `ok`, or `failed` when the
  gateway refused the new share),
- one Alertmanager v4 notification per receiver that wants its labels (`alerts.notify`'s outbox).

Labels: alertname, severity (`info` on a promotion, `warning` on a rollback), instance (the gateway),
decision and canary (the verdict's time, RFC 3339), so each verdict has its own fingerprint; a verdict
already in the history (by fingerprint) is skipped, so a pass run twice never repeats one.
"""

from __future__ import annotations

from dataclasses import asdict

from sqlalchemy import Connection, Engine, insert, select

from specwatch.alerts import notify
from specwatch.alerts.evaluator import Alert, State, Transition, as_text, fingerprint
from specwatch.alerts.rules import AlertConfig
from specwatch.alerts.tables import alert_actions, alert_transitions
from specwatch.collector.db import write_transaction
from specwatch.collector.reads.queries import Window
from specwatch.collector.reads.series import EventRecord, engine_events

RULE = "CanaryVerdict"
KIND = "canary_verdict"
LOOKBACK_S = 3600.0
FIRED = (State.INACTIVE, State.FIRING)  # a verdict is one event: its history entry, and it is not kept firing


def labels_of(event: EventRecord) -> dict[str, str]:
    decision = str(event.detail.get("decision", "unknown"))
    return {
        "alertname": RULE,
        "severity": "info" if decision == "promote" else "warning",
        "instance": event.instance,
        "decision": decision,
        "canary": notify.rfc3339(event.at),
    }


def _figure(value, unit: str = "", digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:.{digits}g}{unit}"


def _arm_figures(arm: dict) -> str:
    """ms/token and requests; with the arm's drafters and acceptance where the verdict has them (a draft canary)."""
    figures = f"{_figure(arm.get('ms_per_token'), ' ms/token')}, {arm.get('requests')} requests"
    if arm.get("drafters") and arm["drafters"] != ["none"]:
        drafters = as_text(", ".join(str(d) for d in arm["drafters"][:8]))
        figures += f", {drafters} acceptance {_figure(arm.get('acceptance_rate'))}"
    return figures


def annotations_of(event: EventRecord) -> dict[str, str]:
    """What happened and why: the decision, the figures before (control) and after (candidate), p."""
    d = event.detail
    before, after = d.get("control") or {}, d.get("candidate") or {}
    share = d.get("share") or {}
    summary = (
        f"canary on {event.instance}: {d.get('decision')} (speed-up {_figure(d.get('speedup'), 'x')}, "
        f"p={_figure(d.get('p_value'))}, alpha {d.get('alpha')})"
    )
    return {
        "summary": summary,
        "description": str(d.get("reason", ""))[:500],
        "before": f"control: {_arm_figures(before)}",
        "after": f"candidate: {_arm_figures(after)}",
        "p_value": _figure(d.get("p_value")),
        "share": f"{share.get('from')} -> {share.get('to')}" + ("" if d.get("applied", True) else " (refused)"),
    }


def verdict_alert(event: EventRecord) -> Alert:
    labels = labels_of(event)
    value = float(event.detail.get("speedup") or 0.0)
    fp = fingerprint(labels)
    return Alert(RULE, fp, labels, annotations_of(event), State.FIRING, value, event.at, event.at, fired_at=event.at)


def _known(conn: Connection, since: float) -> set[str]:
    t = alert_transitions.c
    return set(conn.scalars(select(t.fingerprint).where(t.rule == RULE, t.at >= since - LOOKBACK_S)))


def _record(conn: Connection, config: AlertConfig, alert: Alert, detail: dict, now: float, url: str) -> None:
    fp, at = alert.fingerprint, alert.active_at
    transition = Transition(at, RULE, fp, alert.labels, *FIRED, alert.value)
    conn.execute(insert(alert_transitions).values(**asdict(transition)))
    action = {"at": at, "rule": RULE, "fingerprint": fp}
    outcome = "ok" if detail.get("applied", True) else "failed"
    conn.execute(
        insert(alert_actions).values(
            **action,
            action=f"canary_{alert.labels['decision']}"[:64],
            instance=alert.labels["instance"],
            outcome=outcome,
            detail={k: detail.get(k) for k in ("share", "p_value", "speedup", "alpha", "reason")},
        )
    )
    notify.enqueue(conn, config, RULE, [alert], now, url)


def run_pass(db: Engine, config: AlertConfig, now: float, external_url: str = "") -> int:
    """Turn the new verdicts of the last LOOKBACK_S into history, actions and notifications; how many."""
    verdicts = engine_events(db, Window(now - LOOKBACK_S, now + 60.0), kind=KIND)
    if not verdicts:
        return 0
    with db.connect() as conn:  # most cycles find nothing new: no write lock taken for them
        known = _known(conn, verdicts[0].at)
    fresh = [(verdict_alert(v), v.detail) for v in verdicts]
    fresh = [(a, d) for a, d in fresh if a.fingerprint not in known]
    if fresh:
        with write_transaction(db) as conn:
            for alert, detail in fresh:
                _record(conn, config, alert, detail, now, external_url)
    return len(fresh)
