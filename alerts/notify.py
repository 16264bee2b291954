"""Webhook notifications through a persistent outbox.

The runner turns alerts that need sending into one notification per (receiver, rule) and
stores it in `alert_notifications` in the same transaction as the alert states, so a crash
never loses one and a restart never re-creates one. `deliver_due` posts what is due: on a 2xx
the row is delivered; otherwise it is retried with exponential backoff (the receiver's
`retry_backoff`, default 5 s, doubling up to 10 min) and marked dead after the receiver's
`max_attempts`. A receiver being down loses nothing.

Payload: Alertmanager's webhook version 4 JSON, so existing consumers work unchanged, or a
Slack-compatible `text`/`blocks` message. The monthly report's link travels the same outbox
(`report.delivery` builds its rows with `outbox_row`).
Every POST carries `Idempotency-Key` (a retry of the
same notification repeats it) and, when the receiver has a secret,
`X-Specwatch-Signature: sha256=<hex HMAC-SHA256 of the body>`.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import time
from collections.abc import Sequence
from datetime import UTC, datetime

import httpx
import orjson
from sqlalchemy import Connection, Engine, insert, select, update

from specwatch.alerts.evaluator import Alert, State, as_text
from specwatch.alerts.rules import AlertConfig, Receiver
from specwatch.alerts.tables import alert_notifications
from specwatch.collector.db import write_transaction

log = logging.getLogger("specwatch.alerts")
SIGNATURE_HEADER = "X-Specwatch-Signature"
BACKOFF_MAX_S = 600.0
_ZERO_TIME = "0001-01-01T00:00:00Z"  # Alertmanager's endsAt of a firing alert


def rfc3339(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _common(dicts: Sequence[dict[str, str]]) -> dict[str, str]:
    first = dicts[0] if dicts else {}
    return {k: v for k, v in first.items() if all(d.get(k) == v for d in dicts[1:])}


def alertmanager_payload(receiver: str, rule: str, alerts: Sequence[Alert], external_url: str) -> dict:
    """Alertmanager webhook v4: grouped by alertname, like a route with `group_by: [alertname]`."""
    items = [_alert_item(a, external_url) for a in alerts]
    return {
        "version": "4",
        "groupKey": f'{{}}:{{alertname="{rule}"}}',
        "truncatedAlerts": 0,
        "status": "firing" if any(a.state == State.FIRING for a in alerts) else "resolved",
        "receiver": receiver,
        "groupLabels": {"alertname": rule},
        "commonLabels": _common([a.labels for a in alerts]),
        "commonAnnotations": _common([a.annotations for a in alerts]),
        "externalURL": external_url,
        "alerts": items,
    }


def _alert_item(alert: Alert, external_url: str) -> dict:
    firing = alert.state == State.FIRING
    return {
        "status": "firing" if firing else "resolved",
        "labels": alert.labels,
        "annotations": alert.annotations,
        "startsAt": rfc3339(alert.fired_at or alert.active_at),
        "endsAt": _ZERO_TIME if firing or alert.resolved_at is None else rfc3339(alert.resolved_at),
        "generatorURL": f"{external_url.rstrip('/')}/v1/alerts?rule={alert.rule}",
        "fingerprint": alert.fingerprint,
    }


def slack_payload(payload: dict) -> dict:
    """A Slack-compatible message (`text` + `blocks`) from an Alertmanager payload.

    Producer strings render as text: a summary's label values are escaped already (`evaluator.render`),
    and labels shown raw are escaped here (`&`, `<`, `>`: Slack's escaping), so `<!channel>` or
    `<https://...|...>` in a drafter is neither a mention nor a disguised link."""
    icon = ":red_circle:" if payload["status"] == "firing" else ":large_green_circle:"
    title = f"{icon} [{payload['status'].upper()}] {as_text(payload['groupLabels']['alertname'])}"
    lines = [f"• {a['annotations'].get('summary') or as_text(str(a['labels']))}" for a in payload["alerts"]]
    return {
        "text": f"{title}: {len(payload['alerts'])} alert(s)",
        "blocks": [
            {"type": "header", "text": {"type": "plain_text", "text": title[:150]}},
            {"type": "section", "text": {"type": "mrkdwn", "text": "\n".join(lines)[:3000]}},
        ],
    }


def sign(secret: str, body: bytes) -> str:
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def outbox_row(key: str, receiver: str, rule: str, alert_status: str, payload: dict, now: float) -> dict:
    """One pending notification, due at once."""
    return {
        "key": key,
        "receiver": receiver,
        "rule": rule,
        "alert_status": alert_status,
        "payload": payload,
        "created_at": now,
        "status": "pending",
        "attempts": 0,
        "next_attempt_at": now,
    }


def add_to_outbox(conn: Connection, rows: Sequence[dict]) -> int:
    """Store `outbox_row`s inside the caller's transaction; returns how many."""
    if rows:
        conn.execute(insert(alert_notifications), list(rows))
    return len(rows)


def outbox_keys(conn: Connection, rule: str) -> set[str]:
    """The idempotency keys of every notification stored for `rule`."""
    return set(conn.scalars(select(alert_notifications.c.key).where(alert_notifications.c.rule == rule)))


def _key(identity: str) -> str:
    return hashlib.sha256(identity.encode()).hexdigest()[:32]


def enqueue(
    conn: Connection, config: AlertConfig, rule: str, alerts: Sequence[Alert], now: float, external_url: str
) -> int:
    """Store one notification per receiver that wants any of these alerts; returns how many."""
    rows = []
    for receiver in config.receivers:
        if not (wanted := [a for a in alerts if receiver.wants(a.labels)]):
            continue
        payload = alertmanager_payload(receiver.name, rule, wanted, external_url)
        identity = f"{receiver.name}|{rule}|{now!r}|" + ",".join(f"{a.fingerprint}:{a.state}" for a in wanted)
        status = "firing" if any(a.state == State.FIRING for a in wanted) else "resolved"
        body = slack_payload(payload) if receiver.format == "slack" else payload
        rows.append(outbox_row(_key(identity), receiver.name, rule, status, body, now))
    return add_to_outbox(conn, rows)


def backoff_s(first_s: float, attempts: int) -> float:
    return min(BACKOFF_MAX_S, first_s * 2 ** max(0, attempts - 1))


def deliver_due(db: Engine, config: AlertConfig, http: httpx.Client, now: float | None = None, limit: int = 100) -> int:
    """POST every notification that is due (at most `limit`); returns how many were delivered.

    On PostgreSQL each row is claimed with `FOR UPDATE SKIP LOCKED` in its own transaction, held
    while it is posted and until its outcome is written: two deliverers (two replicas, for a
    moment both leading) never post the same row, and one dying mid-post leaves it pending for a
    retry (same Idempotency-Key). SQLite has one process and one deliverer: its rows are read
    first and posted outside any transaction, so a slow receiver never holds the write lock."""
    now = time.time() if now is None else now
    receivers = {r.name: r for r in config.receivers}
    if db.dialect.name == "postgresql":
        return _deliver_claimed(db, receivers, http, now, limit)
    with db.connect() as conn:
        due = conn.execute(_due(now).limit(limit)).mappings().all()
    delivered = 0
    for row in due:
        error = _attempt(http, receivers.get(row["receiver"]), row)
        with write_transaction(db) as conn:
            _record(conn, row, error, receivers.get(row["receiver"]), now)
        delivered += error is None
    return delivered


def _deliver_claimed(db: Engine, receivers: dict[str, Receiver], http: httpx.Client, now: float, limit: int) -> int:
    delivered = 0
    for _ in range(limit):
        with write_transaction(db) as conn:
            row = conn.execute(_due(now).limit(1).with_for_update(skip_locked=True)).mappings().first()
            if row is None:
                break
            error = _attempt(http, receivers.get(row["receiver"]), row)
            _record(conn, row, error, receivers.get(row["receiver"]), now)
        delivered += error is None
    return delivered


def _due(now: float):
    c = alert_notifications.c
    return select(alert_notifications).where(c.status == "pending", c.next_attempt_at <= now).order_by(c.id)


def _attempt(http: httpx.Client, receiver: Receiver | None, row) -> str | None:
    if receiver is None:
        return "receiver no longer configured"
    return _post(http, receiver, row["key"], row["payload"])


def _post(http: httpx.Client, receiver: Receiver, key: str, payload: dict) -> str | None:
    """One delivery attempt: None on a 2xx, else what went wrong."""
    body = orjson.dumps(payload)
    headers = {"Content-Type": "application/json", "Idempotency-Key": key, "User-Agent": "specwatch-alerts"}
    if secret := receiver.resolved_secret():
        headers[SIGNATURE_HEADER] = sign(secret, body)
    try:
        response = http.post(receiver.url, content=body, headers=headers, timeout=receiver.timeout)
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}"[:1024]
    return None if response.is_success else f"HTTP {response.status_code}: {response.text[:200]}"


def _record(conn: Connection, row, error: str | None, receiver: Receiver | None, now: float) -> None:
    attempts = row["attempts"] + 1
    if error is None:
        changes = {"status": "delivered", "delivered_at": now, "last_error": None}
    elif receiver is None or attempts >= receiver.max_attempts:
        changes = {"status": "dead", "last_error": error}
        log.error(
            "giving up on notification %s to %s after %d attempts: %s", row["key"], row["receiver"], attempts, error
        )
    else:
        changes = {"next_attempt_at": now + backoff_s(receiver.retry_backoff, attempts), "last_error": error}
        log.warning("notification %s to %s failed (attempt %d): %s", row["key"], row["receiver"], attempts, error)
    outbox = alert_notifications
    conn.execute(update(outbox).where(outbox.c.id == row["id"]).values(attempts=attempts, **changes))
