"""Delivery of the monthly report's link: what receivers get, and its rows in the alerts' outbox.

The link travels the alert runner's webhook outbox (`alerts.notify`: retries, HMAC, Idempotency-Key),
one notification per receiver of the rules file that wants `REPORT_LABELS`. The payload is plain
JSON `{"kind": "specwatch.report", "month", "url", **summary}` (no alert: not Alertmanager's shape),
or a Slack `text`. The delivery state is the outbox row: its key is derived from (receiver, month),
so a month goes to a receiver at most once.
"""

from __future__ import annotations

import hashlib
import time

from sqlalchemy import Connection

from specwatch.alerts.notify import add_to_outbox, outbox_keys, outbox_row
from specwatch.alerts.rules import AlertConfig

REPORT_RULE = "SpecwatchMonthlyReport"
REPORT_LABELS = {"alertname": REPORT_RULE, "severity": "info"}  # what receivers' `match` sees for reports
REPORT_STATUS = "report"  # the outbox rows' alert_status


def report_payload(month: str, url: str, summary: dict) -> dict:
    """The monthly report link; `summary` holds the recommendation and net benefit."""
    return {"kind": "specwatch.report", "month": month, "url": url, **summary}


def slack_report(payload: dict) -> dict:
    net = payload.get("net_monthly_benefit_usd")
    money = "" if net is None else f", net benefit {net:,.0f} USD/month"
    action = str(payload.get("recommendation", "")).upper()
    return {
        "text": f":bar_chart: specwatch report {payload['month']}: {action} speculation{money}. "
        f"<{payload['url']}|Open the report>"
    }


def enqueue_report(
    conn: Connection, config: AlertConfig, month: str, url: str, summary: dict, now: float | None = None
) -> int:
    """One notification of the month's report per receiver that wants `REPORT_LABELS` and has not had
    it (calling again adds nothing). Returns how many were added."""
    now = time.time() if now is None else now
    sent, payload = outbox_keys(conn, REPORT_RULE), report_payload(month, url, summary)
    rows = []
    for receiver in config.receivers:
        key = hashlib.sha256(f"{receiver.name}|report|{month}".encode()).hexdigest()[:32]
        if receiver.wants(REPORT_LABELS) and key not in sent:
            body = slack_report(payload) if receiver.format == "slack" else payload
            rows.append(outbox_row(key, receiver.name, REPORT_RULE, REPORT_STATUS, body, now))
    return add_to_outbox(conn, rows)
