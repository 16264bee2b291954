"""Every dashboard page under Streamlit's AppTest, against a collector holding real engine
telemetry: no page raises, the figures shown are the store's, and the threshold lines are the
collector's alert rules'."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import httpx
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
    return dashboard_over(live_collector["url"], monkeypatch)


def dashboard_over(url: str, monkeypatch) -> AppTest:
    """The dashboard over the collector at `url`, showing the last hour (the session's telemetry
    may be older than the default window by the time a test runs)."""
    monkeypatch.setenv("SPECWATCH_COLLECTOR_URL", url)
    from specwatch.dashboard.state import clear_cache

    clear_cache()
    app = AppTest.from_file(APP, default_timeout=60)
    app.session_state["window"] = "last hour"
    return app


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


def collector_json(live_collector: dict, path: str, **params) -> dict:
    return httpx.get(f"{live_collector['url']}{path}", params={"last": 3600, **params}, timeout=60).json()


def test_overview_shows_the_collectors_rates(app, live_collector):
    shown = metrics(open_page(app, "views/overview.py"))
    found = collector_json(live_collector, "/v1/signals")
    assert shown["Requests/s"] == f"{found['request_rate_per_s']:,.3f}"
    assert shown["Output tokens/s"] == f"{found['output_tokens_per_s']:,.1f}"
    assert shown["Drafts/s"] == f"{found['drafts'] / found['active_s']:,.2f}"  # over the collector's span
    assert shown["Output from accepted drafts"] == f"{100 * found['accepted_tokens'] / found['output_tokens']:,.1f}%"


def test_latency_page_shows_each_arms_rate_as_the_collector_gives_it(app, live_collector):
    page = open_page(app, "views/latency.py")
    found = collector_json(live_collector, "/v1/compare", by="arm")
    for side in (found["speculative"], found["plain"]):
        shown = f"{side['key']}: {side['requests']:,} requests, {side['request_rate_per_s']:,.3f} req/s"
        assert shown in captions(page)


def temporal_x_axes(spec: dict) -> list[dict]:
    """Every temporal x encoding in a Vega-Lite spec, layers included."""
    found = [spec["encoding"]["x"]] if spec.get("encoding", {}).get("x", {}).get("type") == "temporal" else []
    return found + [x for layer in spec.get("layer", []) for x in temporal_x_axes(layer)]


@pytest.mark.parametrize("page", [p for p in PAGES if p not in ("views/alerts.py", "views/sources.py")])
def test_every_time_axis_is_24_hour_utc(app, page):
    charts = [json.loads(chart.proto.spec) for chart in open_page(app, page).get("vega_lite_chart")]
    axes = [x for spec in charts for x in temporal_x_axes(spec)]
    assert axes, "no time axis drawn"
    for x in axes:
        assert x["scale"]["type"] == "utc" and "formatType" not in x["axis"], x  # UTC from the scale (charts.py)
        assert x["axis"]["format"] in ("%H:%M", "%m-%d %H:%M", "%Y-%m-%d"), x  # 24-hour: no %I, no %p


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
    from specwatch.common.procs import free_port
    from specwatch.dashboard.state import clear_cache

    monkeypatch.setenv("SPECWATCH_COLLECTOR_URL", f"http://127.0.0.1:{free_port()}")
    clear_cache()
    app = AppTest.from_file(APP, default_timeout=60).run()
    assert not app.exception
    assert "Collector unavailable" in app.error[0].value


def _dollars(text: str) -> float:
    return float(text.replace("$", "").replace(",", ""))


def test_cost_page_shows_the_collectors_cost_model(app, live_collector):
    from specwatch.dashboard.formats import as_markdown_text

    page = open_page(app, "views/cost.py")
    shown = metrics(page)
    found = httpx.get(f"{live_collector['url']}/v1/cost", params={"last": 3600}, timeout=60).json()
    model, verdict = found["tco"], found["verdict"]
    per_mtok = {a["key"]: a["total_usd_per_mtok"] for a in model["arms"]}
    # the page's and this call's windows end a moment apart while the live collector takes traffic
    primary = f"{as_markdown_text(model['primary'])} $ / 1M tokens"  # a metric's label reads Markdown
    assert _dollars(shown[primary]) == pytest.approx(per_mtok[model["primary"]], rel=0.1)
    headers = [h.value for h in page.subheader]
    # the bill (Σ instance bills) heads the tables, with a stacked bar of its parts (issue 52)
    (said,) = [h.replace("\\", "") for h in headers if h.startswith("The bill for this window: ")]
    bill = sum(b["compute_usd"] + b["energy_usd"] for b in model["allocation"]["bills"])
    assert _dollars(said.split(": ")[1].lstrip("~").split(" ")[0]) == pytest.approx(bill, rel=0.2, abs=0.01)
    stacked = [json.loads(c.proto.spec) for c in page.get("vega_lite_chart")]
    assert any(spec.get("encoding", {}).get("x", {}).get("stack") == "zero" for spec in stacked)
    assert "Assumptions" in headers and "Cost per 1M output tokens against concurrency" in headers
    assumptions = page.dataframe[
        [d.value.columns.tolist() for d in page.dataframe].index(["input", "value", "unit", "source"])
    ].value
    assert set(assumptions["input"]) >= {"pricing", "incident_days_per_week", "tech_debt_buffer"}
    assert "default (seed)" in set(assumptions["source"])
    # the page states the API's verdict, and its saving, untouched by the what-if (nothing changed)
    # (the same answer: drafter and paying or not; the volume moves while the live collector takes traffic)
    answer = verdict["sentence"].split(" at the load served")[0]
    assert page.markdown[0].value.startswith(f"**{as_markdown_text(answer)} at the load served")
    assert shown["Saving / month (measured)"].startswith("$" if verdict["paying"] else "-$")  # the window moves
    assert any(label.startswith("Pays its fixed costs above") for label in shown)
    assert _dollars(shown["Plain $ / 1M tokens"]) == pytest.approx(per_mtok["autoregressive"], rel=0.1)
    assert shown["Plain $ / 1M tokens"].startswith("$")


def test_cost_page_builds_the_monthly_report_for_download(app, live_collector):
    import time

    page = open_page(app, "views/cost.py")
    build = next(b for b in page.button if b.label == "Build the report")
    build.click().run()
    assert not page.exception and not page.error
    from specwatch.dashboard.cost_service import report_html

    html = report_html(time.strftime("%Y-%m", time.gmtime())).decode()
    assert html.startswith("<!DOCTYPE html>") and "speculative" in html.lower()


@pytest.fixture(scope="module")
def custom_rules_collector(live_collector, tmp_path_factory):
    """A second collector over a copy of the live store whose rules file moves the TTFT line to
    1.5 s and the acceptance line to 0.45, and drops the fragmentation rule."""
    import yaml

    from specwatch.alerts.rules import DEFAULT_RULES
    from specwatch.common.procs import free_port, start_collector

    data = tmp_path_factory.mktemp("custom-rules")
    with sqlite3.connect(live_collector["db"]) as source, sqlite3.connect(data / "specwatch.db") as copy:
        source.backup(copy)
    rules = yaml.safe_load(DEFAULT_RULES.read_text())
    rules["rules"] = [r for r in rules["rules"] if r["name"] != "MemoryFragmentationHigh"]
    for rule in rules["rules"]:
        rule["threshold"] = {"TTFTP99High": 1.5, "SpecAcceptanceLow": 0.45}.get(rule["name"], rule["threshold"])
    (data / "rules.yaml").write_text(yaml.safe_dump(rules, sort_keys=False))
    port = free_port()
    env = {"SPECWATCH_ALERT_RULES": str(data / "rules.yaml"), "SPECWATCH_DATA_DIR": str(data)}
    collector = start_collector(port, data / "collector.log", f"sqlite:///{data / 'specwatch.db'}", env=env)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        collector.terminate()
        collector.wait(30)


def deltas(app: AppTest) -> dict[str, str | None]:
    return {m.label: m.delta for m in app.metric}


def captions(app: AppTest) -> str:
    return "\n".join(c.value for c in app.caption)


def test_lines_are_the_shipped_rules_thresholds_by_default(app):
    page = open_page(app, "views/overview.py")
    assert deltas(page)["TTFT P99"].endswith(" ms vs 300 ms")
    assert deltas(page)["Acceptance rate"].endswith(" vs 0.6")
    assert "TTFTP99High fires when TTFT P99 > 300 ms" in captions(page)


def test_a_threshold_changed_in_the_rules_file_moves_the_dashboards_line(custom_rules_collector, monkeypatch):
    page = open_page(dashboard_over(custom_rules_collector, monkeypatch), "views/overview.py")
    assert deltas(page)["TTFT P99"].endswith(" ms vs 1.5 s")
    assert deltas(page)["Acceptance rate"].endswith(" vs 0.45")
    assert "TTFTP99High fires when TTFT P99 > 1.5 s" in captions(page)
    assert "SpecAcceptanceLow fires when acceptance < 0.45" in captions(page)

    latency = open_page(dashboard_over(custom_rules_collector, monkeypatch), "views/latency.py")
    assert "TTFTP99High fires when TTFT P99 > 1.5 s" in captions(latency)
    memory = open_page(dashboard_over(custom_rules_collector, monkeypatch), "views/memory.py")
    assert "No alert rule is set on fragmentation" in captions(memory)
    # CPU samples: the heap ratio, marked not applicable; no rule, no distance to it
    assert not deltas(memory)["Heap ratio (latest; fragmentation not applicable on CPU)"]
