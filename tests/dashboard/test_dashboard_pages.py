"""Every dashboard page under Streamlit's AppTest, against a collector holding real engine
telemetry: no page raises, and the figures shown are the store's."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py")
PAGES = (
    "views/overview.py",
    "views/acceptance.py",
    "views/latency.py",
    "views/memory.py",
    "views/alerts.py",
    "views/cost.py",
    "views/sources.py",
)


@pytest.fixture
def app(live_collector, monkeypatch):
    monkeypatch.setenv("SPECWATCH_COLLECTOR_URL", live_collector["url"])
    from dashboard.state import _cached

    _cached.clear()
    return AppTest.from_file(APP, default_timeout=60)


def open_page(app: AppTest, page: str) -> AppTest:
    app.run()
    app.switch_page(page).run()
    assert not app.exception, [e.value for e in app.exception]
    assert not app.error, [e.value for e in app.error]
    return app


def stored(db: Path, sql: str) -> list[tuple]:
    with sqlite3.connect(db) as conn:
        return conn.execute(sql).fetchall()


def metrics(app: AppTest) -> dict[str, str]:
    return {m.label: m.value for m in app.metric}


@pytest.mark.parametrize("page", PAGES)
def test_page_renders_without_errors(app, page):
    open_page(app, page)


def test_overview_shows_the_stored_acceptance_and_mode_share(app, live_collector):
    shown = metrics(open_page(app, "views/overview.py"))
    ((accepted, drafted, speculative, total),) = stored(
        live_collector["db"],
        "select sum(num_accepted_tokens), sum(num_draft_tokens), sum(mode = 'speculative'), count(*) from requests",
    )
    assert shown["Acceptance rate"] == f"{accepted / drafted:,.3f}"
    assert shown["Speculative share"] == f"{100 * speculative / total:,.0f}%"
    assert shown["Speed-up (A/B arms)"].endswith("×")  # canary arms exist: measured from them


def test_acceptance_page_lists_each_drafter(app, live_collector):
    page = open_page(app, "views/acceptance.py")
    drafters = {d for (d,) in stored(live_collector["db"], "select distinct coalesce(drafter, 'none') from requests")}
    assert {"ngram", "early-exit:2"} <= drafters
    frames = [df.value for df in page.dataframe]
    assert any("code" in set(f.get("group", [])) or "grounded" in set(f.get("group", [])) for f in frames)


def test_memory_page_marks_estimated_power(app, live_collector):
    page = open_page(app, "views/memory.py")
    ((source,),) = stored(live_collector["db"], "select power_source from device_samples order by at desc limit 1")
    shown = metrics(page)
    assert ("Power (estimated)" in shown) == (source == "estimate")
    if source == "estimate":
        assert any("estimates" in w.value for w in page.warning)


def test_sources_page_lists_the_engine(app):
    page = open_page(app, "views/sources.py")
    (frame,) = [df.value for df in page.dataframe][:1]
    assert "laptop" in set(frame["name"])


def test_unreachable_collector_is_a_banner_not_a_traceback(monkeypatch):
    from dashboard.state import _cached
    from specwatch.common import free_port

    monkeypatch.setenv("SPECWATCH_COLLECTOR_URL", f"http://127.0.0.1:{free_port()}")
    _cached.clear()
    app = AppTest.from_file(APP, default_timeout=60).run()
    assert not app.exception
    assert "Collector unavailable" in app.error[0].value


def test_cost_page_shows_the_collectors_cost_model(app, live_collector):
    import httpx

    shown = metrics(open_page(app, "views/cost.py"))
    model = httpx.get(f"{live_collector['url']}/v1/cost", params={"last": 3600}, timeout=60).json()["tco"]
    per_mtok = {a["key"]: a["total_usd_per_mtok"] for a in model["arms"]}
    assert shown[f"{model['primary']} $ / 1M tokens"] == f"{per_mtok[model['primary']]:,.4f}"
    assert shown["Plain $ / 1M tokens"] == f"{per_mtok['autoregressive']:,.4f}"


def test_cost_page_builds_the_monthly_report_for_download(app, live_collector):
    import time

    page = open_page(app, "views/cost.py")
    build = next(b for b in page.button if b.label == "Build the report")
    build.click().run()
    assert not page.exception and not page.error
    from dashboard import services

    html = services.report_html(time.strftime("%Y-%m", time.gmtime())).decode()
    assert html.startswith("<!DOCTYPE html>") and "speculative" in html.lower()
