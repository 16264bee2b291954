"""The real-engine check of issue 27: the bundled model serves n-gram drafts, the control API switches its
default drafter to an untrained early exit mid-traffic (a `config` deploy marker), and the leader's cycle
fires SpecAcceptanceRegression naming that marker with before/after acceptance, and flags the early exit's
requests `collapse` against the instance's acceptance before the marker (`alerts.anomalies`): a collector
started on that store lists them in GET /v1/requests?flag=collapse, and the dashboard's Requests page shows
them in Chromium (docs/screenshots/requests.png; skipped with the reason without Chromium or playwright).

The switch runs once per store (SQLite and PostgreSQL), ~55 s each; the screenshot on SQLite only."""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from browser_harness import VIEWPORT, browser_missing, chromium, dashboard, full_page_screenshot, settle
from engine_harness import BackgroundServer
from sqlalchemy import text

from specwatch.alerts.rules import parse_config
from specwatch.alerts.runner import AlertRunner
from specwatch.alerts.store import active_alerts
from specwatch.collector.db import make_db, upgrade
from specwatch.collector.ingest.store import Store
from specwatch.common.procs import free_port, start_collector, stop_process
from specwatch.engine.policy import PolicyConfig
from specwatch.engine.scheduler import SchedulerConfig
from specwatch.telemetry.schema import EngineEvent, IngestBatch, RequestRecord
from specwatch.workload import chat

pytestmark = pytest.mark.slow
TOKEN = {"authorization": "Bearer s3cret"}
PER_SIDE = 12
RULE = {
    "name": "SpecAcceptanceRegression",
    "signal": "acceptance_regression",
    "op": ">=",
    "threshold": 0.1,
    "window": "6h",
    "min_samples": PER_SIDE - 2,
    "group_by": ["instance", "model", "marker"],
}
# the policy's cost lookahead soon drafts little with a drafter that is never accepted: count every draft
DETECTORS = {
    "regression": {"min_requests": PER_SIDE - 2, "min_drafted_tokens": 1},
    "anomalies": {"min_drafted_tokens": 1, "baseline_min_requests": PER_SIDE - 2},
}
SCREENSHOT = Path(__file__).resolve().parents[2] / "docs" / "screenshots" / "requests.png"


@dataclass(frozen=True)
class Switched:
    db_url: str
    collector_url: str  # a collector process on that store, started after the leader's cycle
    marker: EngineEvent
    records: tuple[RequestRecord, ...]
    alerts: tuple  # the active alerts right after the cycle


def serve(server: BackgroundServer, n: int) -> None:
    """`n` requests naming no drafter (the server's default), each copying a passage."""
    for i in range(n):
        server.client().chat.completions.create(
            model=None, messages=chat("grounded"), max_tokens=40, temperature=0, extra_body={"gamma": 4, "seed": i}
        )


def switch_drafter(bundled_engine) -> tuple[list[RequestRecord], list[EngineEvent]]:
    """PER_SIDE requests with n-gram drafts, the switch to the early exit, PER_SIDE more."""
    events: list[EngineEvent] = []
    policy = PolicyConfig(min_acceptance=0.0)  # keep speculating on a bad drafter: the alert must see it
    with BackgroundServer(bundled_engine, SchedulerConfig(slots=1), policy, control_token="s3cret") as server:
        server.sink.subscribe(EngineEvent, events.append)
        mode = f"{server.url}/v1/control/mode"
        assert httpx.post(mode, json={"mode": "auto", "drafter": "ngram"}, headers=TOKEN).status_code == 200
        serve(server, PER_SIDE)
        assert httpx.post(mode, json={"mode": "auto", "drafter": "early-exit:4"}, headers=TOKEN).status_code == 200
        serve(server, PER_SIDE)
        return list(server.records), events


def store_url(request, tmp: Path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp / 'specwatch.db'}"
    url = request.getfixturevalue("postgres_url")
    db = make_db(url)
    with db.begin() as conn:  # an empty store, as tests/conftest.py's db_url gives each test
        conn.execute(text("DROP SCHEMA public CASCADE"))
        conn.execute(text("CREATE SCHEMA public"))
    db.dispose()
    return url


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def switched(request, bundled_engine, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("switch")
    db_url = store_url(request, tmp)
    db = make_db(db_url)
    upgrade(db)
    records, events = switch_drafter(bundled_engine)
    batch = {"requests": [r.model_dump() for r in records], "samples": [], "events": [e.model_dump() for e in events]}
    Store(db).insert(IngestBatch.model_validate(batch))
    marker = [e for e in events if e.kind == "config"][-1]
    AlertRunner(db, parse_config({"rules": [RULE], "receivers": [], "detectors": DETECTORS})).cycle(marker.at + 600)
    alerts = tuple(active_alerts(db)[0])
    db.dispose()
    port = free_port()
    collector = start_collector(port, tmp / "collector.log", db_url)
    try:
        yield Switched(db_url, f"http://127.0.0.1:{port}", marker, tuple(records), alerts)
    finally:
        stop_process(collector, timeout_s=15)


def test_switching_to_an_untrained_early_exit_fires_the_regression_at_its_marker(switched):
    (alert,) = switched.alerts
    assert alert.state.value == "firing" and alert.labels["instance"] == switched.marker.instance
    assert alert.labels["marker"] in alert.annotations["marker"] and alert.annotations["marker"].endswith(
        "(default_drafter: ngram → early-exit:4; drafter: ngram → early-exit:4)"
    )
    assert float(alert.annotations["before"]) > 0.3 > float(alert.annotations["after"])
    assert float(alert.annotations["p_value"]) < 0.01 and alert.annotations["drafters_after"] == "early-exit:4"


def collapsed(r: RequestRecord) -> bool:
    return r.drafter == "early-exit:4" and r.num_draft_tokens >= 1 and r.num_accepted_tokens == 0


def test_the_early_exits_requests_are_listed_as_collapsed(switched):
    window = {"start": switched.records[0].started_at - 1, "end": switched.marker.at + 3600}
    body = httpx.get(f"{switched.collector_url}/v1/requests", params=window | {"flag": "collapse", "limit": 100})
    assert body.status_code == 200, body.text
    rows = body.json()["rows"]
    expected = {r.request_id for r in switched.records if collapsed(r)}
    assert len(expected) >= PER_SIDE - 2  # the early exit accepted nothing, and drafted on most requests
    assert {row["request_id"] for row in rows} == expected
    assert all(row["drafter"] == "early-exit:4" and "collapse" in row["flags"] for row in rows)
    detail = httpx.get(f"{switched.collector_url}/v1/requests/{rows[0]['request_id']}").json()
    (flag,) = [f for f in detail["flags"] if f["flag"] == "collapse"]
    assert flag["detail"]["baseline_drafters"] == ["ngram"] and flag["expected"] > 0.3


def test_the_requests_page_shows_them_in_chromium(switched, tmp_path):
    """Flag `collapse` picked on the Requests page, its first request opened: the one the listing led with."""
    if not switched.db_url.startswith("sqlite"):
        pytest.skip("one screenshot: taken on the SQLite store")
    if reason := browser_missing():
        pytest.skip(reason)
    expected = {r.request_id for r in switched.records if collapsed(r)}
    with chromium() as browser, dashboard(switched.collector_url, tmp_path / "dashboard.log") as url:
        page = browser.new_context(viewport=VIEWPORT).new_page()
        page.goto(url, wait_until="domcontentloaded", timeout=30_000)  # `/` first: the router, then the page
        page.get_by_test_id("stSidebar").get_by_text("Time window", exact=True).wait_for(timeout=30_000)
        page.goto(f"{url}/requests", wait_until="domcontentloaded", timeout=30_000)
        page.get_by_test_id("stDataFrame").first.wait_for(state="visible", timeout=30_000)
        pick(page, "Flag", page.get_by_role("option", name="collapse", exact=True))
        pick(page, "Open a request", page.get_by_role("option").nth(1))  # option 0 is "—"
        opened = page.get_by_role("heading", name=re.compile(r"^Request \S+$")).first
        opened.wait_for(timeout=30_000)
        settle(page)
        assert page.get_by_test_id("stException").count() == 0, page.get_by_test_id("stException").all_inner_texts()
        assert opened.inner_text().removeprefix("Request ").strip() in expected
        page.get_by_text("Anomaly flags", exact=True).wait_for(timeout=15_000)
        full_page_screenshot(page, tmp_path / "requests.png")
    SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(tmp_path / "requests.png", SCREENSHOT)


def pick(page, label: str, option) -> None:
    """Open the selectbox labelled `label` and click `option` in its list, then let the page rerun."""
    page.get_by_test_id("stSelectbox").filter(has=page.get_by_text(label, exact=True)).click()
    option.click()
    settle(page)
