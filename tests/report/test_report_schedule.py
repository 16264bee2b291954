"""The scheduled monthly report: written once per month by the collector process, its link
queued once per receiver in the alerts outbox and posted to real local webhook receivers
(HMAC-signed, Slack format for Slack receivers); the link is served by the collector."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import httpx
import yaml
from collector_payloads import PLAIN, request_dict
from sqlalchemy import select
from waiting import wait_for
from webhook_receiver import Receiver  # noqa: E402

from specwatch.alerts.notify import SIGNATURE_HEADER, deliver_due, sign
from specwatch.alerts.rules import parse_config
from specwatch.alerts.tables import alert_notifications
from specwatch.collector.db import make_db, upgrade
from specwatch.collector.ingest.store import Store
from specwatch.collector.settings import Settings
from specwatch.common import procs
from specwatch.common.procs import free_port
from specwatch.report.build import last_month, month_window
from specwatch.report.delivery import REPORT_RULE
from specwatch.report.schedule import run_once
from specwatch.telemetry.schema import IngestBatch

SECRET = "report-s3cret"
NOW = datetime(2026, 7, 1, 3, tzinfo=UTC).timestamp()  # June is last month


def _requests(start: float, n: int = 40) -> IngestBatch:
    return IngestBatch.model_validate(
        {
            "requests": [
                request_dict(i, started_at=start + 600 * i, draft_s=0.01, verify_s=0.2, **(PLAIN if i % 2 else {}))
                for i in range(n)
            ]
        }
    )


def _config(ops_url: str, slack_url: str) -> dict:
    return {
        "rules": [],
        "receivers": [
            {"name": "ops", "url": ops_url, "secret": SECRET, "retry_backoff": "0.2s"},
            {"name": "chat", "url": slack_url, "format": "slack"},
            {"name": "pager", "url": "http://127.0.0.1:9/never", "match": {"severity": "critical"}},  # no reports
        ],
    }


def _outbox(db) -> list:
    with db.connect() as conn:
        return conn.execute(select(alert_notifications).where(alert_notifications.c.rule == REPORT_RULE)).all()


def test_written_once_and_queued_once_per_receiver(db, tmp_path):
    Store(db).insert(_requests(datetime(2026, 6, 3, tzinfo=UTC).timestamp()))
    settings = Settings(
        data_dir=tmp_path, report_dir=tmp_path / "reports", external_url="http://specwatch.example:8000/"
    )
    ops, chat = Receiver(free_port()), Receiver(free_port())
    config = parse_config(
        _config(f"http://127.0.0.1:{ops.server.server_port}/hook", f"http://127.0.0.1:{chat.server.server_port}/slack")
    )
    try:
        written = run_once(db, settings, config, now=NOW)
        assert written == tmp_path / "reports" / "specwatch-report-2026-06.html" and written.exists()
        assert written.with_suffix(".json").exists()
        assert sorted(r.receiver for r in _outbox(db)) == ["chat", "ops"]

        assert run_once(db, settings, config, now=NOW + 3600) is None  # the hourly check: nothing new
        stored = json.loads(written.with_suffix(".json").read_text())
        written.unlink()
        assert run_once(db, settings, config, now=NOW + 7200) == written  # the file comes back...
        assert len(_outbox(db)) == 2  # ...but nobody is told twice

        with httpx.Client() as http:
            assert deliver_due(db, config, http, now=NOW + 7200) == 2
        ((headers, body),) = ops.received
        ((_, slack_body),) = chat.received
    finally:
        ops.close()
        chat.close()
    assert headers[SIGNATURE_HEADER] == sign(SECRET, body) and headers["Idempotency-Key"] == next(
        r.key for r in _outbox(db) if r.receiver == "ops"
    )
    payload = json.loads(body)
    assert payload == {
        "kind": "specwatch.report",
        "month": "2026-06",
        "url": "http://specwatch.example:8000/v1/reports/specwatch-report-2026-06.html",
        "recommendation": stored["recommendation"]["action"],
        "reason": stored["recommendation"]["reason"],
        "net_monthly_benefit_usd": stored["headline"]["net_monthly_benefit_usd"],
        "net_benefit_estimated_from": stored["headline"]["net_benefit_estimated_from"],
        "requests": 40,
    }
    text = json.loads(slack_body)["text"]
    assert "specwatch report 2026-06" in text and payload["url"] in text
    assert {r.status for r in _outbox(db)} == {"delivered"}


def test_without_receivers_or_external_url(db, tmp_path):
    settings = Settings(data_dir=tmp_path, report_dir=tmp_path / "reports")
    written = run_once(db, settings, None, now=NOW)
    assert "No traffic in 2026-06" in written.read_text() and _outbox(db) == []


def test_collector_process_writes_and_delivers_last_months_report(tmp_path):
    """A real collector with SPECWATCH_REPORT_DIR over a store holding last month's requests: on
    start it writes the report, the alert runner posts the link, and the link opens the report."""
    month = last_month()
    db_url = f"sqlite:///{tmp_path / 'store.db'}"
    db = make_db(db_url)
    upgrade(db)
    Store(db).insert(_requests(month_window(month).start + 3600))
    db.dispose()
    receiver_port, port = free_port(), free_port()
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        yaml.safe_dump(
            {
                **_config(f"http://127.0.0.1:{receiver_port}/hook", "http://127.0.0.1:9/slack"),
                "evaluation": {"interval": "0.5s"},
            }
        )
    )
    receiver = Receiver(receiver_port)
    api = f"http://127.0.0.1:{port}"
    collector = procs.start_collector(
        port,
        tmp_path / "collector.log",
        db_url,
        {
            "SPECWATCH_REPORT_DIR": str(tmp_path / "reports"),
            "SPECWATCH_ALERT_RULES": str(rules),
            "SPECWATCH_EXTERNAL_URL": api,
            "SPECWATCH_RETENTION_DAYS": "36500",
        },
    )
    try:
        wait_for(
            lambda: receiver.received,
            lambda: "the report webhook; collector log:\n" + (tmp_path / "collector.log").read_text()[-2000:],
            timeout=120,
            interval=0.2,
        )
        ((headers, body),) = receiver.received
        payload = json.loads(body)
        assert headers[SIGNATURE_HEADER] == sign(SECRET, body)
        assert (payload["kind"], payload["month"], payload["requests"]) == ("specwatch.report", month, 40)
        page = httpx.get(payload["url"], timeout=10)
        assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
        assert f"specwatch monthly report: {month}" in page.text
        assert httpx.get(f"{api}/v1/reports").json()["reports"] == [
            f"specwatch-report-{month}.html",
            f"specwatch-report-{month}.json",
        ]
        assert httpx.get(f"{api}/v1/reports/..%2Fstore.db").status_code == 404
    finally:
        collector.terminate()
        collector.wait(30)
        receiver.close()
