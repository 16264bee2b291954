"""The monthly report, written by the collector process (`SPECWATCH_REPORT_DIR`).

On start and then every hour, `run_once` checks last month's report (UTC): when its HTML file
is missing from the report directory it is built and written, and its link is put into the
alerts outbox, one notification per receiver of the rules file (`report.delivery.enqueue_report`),
which the alert runner's delivery loop posts with retries and HMAC like any alert. The outbox
key is derived from (receiver, month), so a restart, a rewritten file or an hourly check never
sends a month twice. The link points at this collector (`GET /v1/reports/<file>`, under
`SPECWATCH_EXTERNAL_URL`), or at the file when no external URL is set. With
`SPECWATCH_REPORT_HIDDEN_COSTS=FILE.toml` the report's hidden costs are taken from that file (as
`specwatch report --hidden-costs`); `specwatch collector serve` refuses to start when it is bad.
"""

from __future__ import annotations

import asyncio
import logging
import time
from pathlib import Path

from sqlalchemy import Engine

from specwatch.collector.db import write_transaction
from specwatch.collector.settings import Settings
from specwatch.cost.model import HiddenCosts
from specwatch.report.build import Report, build_report, last_month, report_names
from specwatch.report.delivery import enqueue_report
from specwatch.report.html import write_report

log = logging.getLogger("specwatch.collector")
CHECK_INTERVAL_S = 3600.0


def report_url(settings: Settings, path: Path) -> str:
    base = settings.external_url.rstrip("/")
    return f"{base}/v1/reports/{path.name}" if base else path.resolve().as_uri()


def summary(report: Report) -> dict:
    """What the notification says besides the link."""
    return {
        "recommendation": report.recommendation.action,
        "reason": report.recommendation.reason,
        "net_monthly_benefit_usd": report.headline.net_monthly_benefit_usd,
        "net_benefit_estimated_from": list(report.headline.net_benefit_estimated_from),
        "requests": report.headline.requests,
    }


def run_once(db: Engine, settings: Settings, config=None, now: float | None = None) -> Path | None:
    """Write last month's report unless its HTML file exists, then enqueue its link for the
    receivers of `config` (an `alerts.rules.AlertConfig`; None: no delivery) that have not had it.
    Returns the HTML path when a report was written."""
    from specwatch.cost.inputs import load_prices

    now = time.time() if now is None else now
    month, report_dir = last_month(now), Path(settings.report_dir)
    html_path, written, report = report_dir / report_names(month)[0], None, None
    if not html_path.exists():
        report = build_report(db, month, load_prices(), now=now, hidden=hidden_costs(settings))
        written, _ = write_report(report, report_dir)
        log.info("wrote the %s report: %s", month, written)
    if config is not None and config.receivers:
        report = report or _stored_summary(html_path)
        notes = summary(report) if isinstance(report, Report) else report
        with write_transaction(db) as conn:
            if sent := enqueue_report(conn, config, month, report_url(settings, html_path), notes, now):
                log.info("queued the %s report link for %d receiver(s)", month, sent)
    return written


def hidden_costs(settings: Settings) -> HiddenCosts | None:
    """The hidden-cost overrides of `SPECWATCH_REPORT_HIDDEN_COSTS` (None: not set); ValueError, one line,
    for a bad file."""
    from specwatch.cost.inputs import load_hidden_costs

    if settings.report_hidden_costs is None:
        return None
    return load_hidden_costs(settings.report_hidden_costs)


def _stored_summary(html_path: Path) -> dict:
    """The summary from the JSON written next to an existing HTML report (empty if unreadable)."""
    import orjson

    try:
        data = orjson.loads(html_path.with_suffix(".json").read_bytes())
        return {
            "recommendation": data["recommendation"]["action"],
            "reason": data["recommendation"]["reason"],
            "net_monthly_benefit_usd": data["headline"]["net_monthly_benefit_usd"],
            "net_benefit_estimated_from": data["headline"].get("net_benefit_estimated_from", []),
            "requests": data["headline"]["requests"],
        }
    except (OSError, ValueError, KeyError, TypeError):
        return {}


async def report_loop(db: Engine, settings: Settings, interval_s: float = CHECK_INTERVAL_S) -> None:
    """Runs until cancelled; a failing check is logged and retried at the next one."""
    config = _alert_config(settings)
    while True:
        try:
            await asyncio.to_thread(run_once, db, settings, config)
        except Exception:  # noqa: BLE001 - keep the schedule alive; the next check retries
            log.exception("monthly report failed")
        await asyncio.sleep(interval_s)


def _alert_config(settings: Settings):
    """The receivers come from the rules file, delivered by the alert runner: none without it."""
    if not settings.alerts_enabled:
        return None
    from specwatch.alerts.rules import load_config

    return load_config(settings.alert_rules)
