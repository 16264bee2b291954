"""Every dashboard page in headless Chromium, served by `streamlit run` over a collector holding
real engine telemetry: the page renders its content, shows no exception, and is screenshotted.

Screenshots go to tests/artifacts/screenshots/ (ignored by git): `<page>.png` is the full page
(docs/screenshots/ holds copies of four of them), `<page>-viewport.png` the first 1440x900 screen.

The server is first opened at `/`, as a person would: see `test_deep_link_on_a_fresh_server`
for what a deep link does before that.

Needs Chromium at /usr/bin/chromium (`make test` installs it as root) and the `playwright` package;
the module is skipped without them. No browser is downloaded (`playwright install` is not used).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import httpx
import pytest
from browser_harness import (
    VIEWPORT,
    browser_missing,
    chromium,
    dashboard,
    full_page_screenshot,
    settle,
    sidebar_filters,
)

if reason := browser_missing():
    pytest.skip(reason, allow_module_level=True)
from playwright import sync_api  # noqa: E402

SCREENSHOTS = Path(__file__).resolve().parents[1] / "artifacts" / "screenshots"
METRIC = '[data-testid="stMetricValue"]'
# page → (URL path, what shows it has rendered its content: a metric where the page has any, else its title).
# The default page is served at `/` only: st.navigation answers /overview with "Page not found".
PAGES = {
    "overview": ("", METRIC),
    "acceptance": ("acceptance", "h1"),
    "latency": ("latency", METRIC),
    "memory": ("memory", METRIC),
    "alerts": ("alerts", METRIC),
    "cost": ("cost", METRIC),
    "sources": ("sources", "h1"),
    "requests": ("requests", '[data-testid="stDataFrame"]'),
}


@pytest.fixture(scope="module")
def browser():
    with chromium() as launched:
        yield launched


@pytest.fixture(scope="module")
def dashboard_url(live_collector, browser, tmp_path_factory):
    with dashboard(live_collector["url"], tmp_path_factory.mktemp("browser") / "dashboard.log") as url:
        context = browser.new_context(viewport=VIEWPORT)
        try:  # warm-up: the first page load compiles the app
            page = context.new_page()
            page.goto(url, wait_until="domcontentloaded", timeout=30_000)
            sidebar_filters(page).wait_for(state="visible", timeout=30_000)
        finally:
            context.close()
        yield url


@pytest.mark.parametrize("name", list(PAGES))
def test_page_renders_in_chromium(browser, dashboard_url, name):
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    try:
        path, rendered = PAGES[name]
        page.goto(f"{dashboard_url}/{path}", wait_until="domcontentloaded", timeout=30_000)
        page.locator(rendered).first.wait_for(state="visible", timeout=30_000)
        sidebar_filters(page).wait_for(state="visible", timeout=15_000)  # run through app.py's router
        settle(page)

        exceptions = page.locator('[data-testid="stException"]')
        assert exceptions.count() == 0, exceptions.all_inner_texts()
        assert page.get_by_text("Traceback").count() == 0, page.locator("body").inner_text()
        assert page.get_by_text("Page not found").count() == 0, page.url
        assert name in page.locator("h1").first.inner_text().lower()

        page.screenshot(path=str(SCREENSHOTS / f"{name}-viewport.png"))
        full_page_screenshot(page, SCREENSHOTS / f"{name}.png")
    finally:
        context.close()


def test_deep_link_on_a_fresh_server(browser, live_collector, tmp_path):
    with dashboard(live_collector["url"], tmp_path / "dashboard.log") as url:
        context = browser.new_context(viewport=VIEWPORT)
        try:
            page = context.new_page()
            page.goto(f"{url}/acceptance", wait_until="domcontentloaded", timeout=30_000)
            page.locator("h1").first.wait_for(state="visible", timeout=30_000)
            try:
                sidebar_filters(page).wait_for(state="visible", timeout=5_000)
            except sync_api.TimeoutError:
                raise AssertionError(
                    "no sidebar filters: the page ran without app.py; sidebar: "
                    + page.get_by_test_id("stSidebar").inner_text().replace("\n\n", ", ")
                ) from None
        finally:
            context.close()


def _verdict_line(browser, url: str) -> str:
    """The page's first bold line (the verdict), as a person reads it."""
    context = browser.new_context(viewport=VIEWPORT)
    page = context.new_page()
    try:
        page.goto(url, wait_until="domcontentloaded", timeout=30_000)
        page.locator(METRIC).first.wait_for(state="visible", timeout=60_000)
        settle(page)
        line = page.locator('[data-testid="stMarkdownContainer"] strong').first
        line.wait_for(state="visible", timeout=30_000)
        return line.inner_text()
    finally:
        context.close()


def test_overview_and_cost_page_state_the_same_verdict(browser, dashboard_url):
    """Issue 52: one answer. Both pages open with the verdict; the answer (drafter, paying or not) is the
    same, and the Cost page's what-if, left alone, changes nothing."""
    overview, cost = (_verdict_line(browser, f"{dashboard_url}/{path}") for path in ("", "cost"))
    assert overview.startswith(("Speculation (", "Not measured")), overview
    assert overview.split(" at the load served")[0] == cost.split(" at the load served")[0], (overview, cost)
    assert "$" in overview and "\\" not in overview  # shown as text: no Markdown or LaTeX ate a character


# Issue 55: every page as an engineer reads it, at 1,280 px.
NARROW = {"width": 1280, "height": 900}
ZONE = "Asia/Kolkata"  # the browser's clock, UTC+5:30: an axis in local time would tick at :30
TIME_LABEL = re.compile(r"^(\d{2}-\d{2} )?\d{2}:\d{2}$|^\d{4}-\d{2}-\d{2}$")  # 24-hour %H:%M, dated beyond a day
EPOCH = re.compile(r"\b1[6-9]\d{8}(\.\d+)?\b")  # epoch seconds (2020-2033) as a raw number
DICT_REPR = re.compile(r"\{'[^']*': ")  # a Python dict's repr
INTERNALS = {"id", "fingerprint", "key", "at", "created_at", "payload", "labels", "started_at"}
# every time-axis tick label, and every visible text, read from the page as rendered (charts are SVG)
READ_AXES = """() => [...document.querySelectorAll('[data-testid="stVegaLiteChart"] svg')].flatMap(svg =>
    [...svg.querySelectorAll('g.role-axis')].filter(axis =>
        [...axis.querySelectorAll('g.role-axis-title text')].some(t => t.textContent.includes('(UTC)')))
    .map(axis => [...axis.querySelectorAll('g.role-axis-label text')].map(t => t.textContent)))"""
READ_TEXT = """() => [document.querySelector('[data-testid="stMain"]')?.innerText ?? '',
    ...[...document.querySelectorAll('[data-testid="stVegaLiteChart"] svg text')].map(t => t.textContent),
    ...[...document.querySelectorAll('[data-testid="stDataFrame"]')]
        .filter(d => !d.closest('[data-testid="stExpander"] details:not([open])'))
        .flatMap(d => [...d.querySelectorAll('table th, table td')].map(c => c.textContent))].join('\\n')"""
READ_TABLES = """() => [...document.querySelectorAll('[data-testid="stDataFrame"]')]
    .filter(d => d.offsetParent !== null)
    .map(d => ({right: d.getBoundingClientRect().right,
                first: d.querySelector('table th')?.textContent ?? null}))"""


def _open(browser, url: str):
    context = browser.new_context(viewport=NARROW, timezone_id=ZONE)
    page = context.new_page()
    page.goto(url, wait_until="domcontentloaded", timeout=30_000)
    sidebar_filters(page).wait_for(state="visible", timeout=60_000)
    page.locator("h1").first.wait_for(state="visible", timeout=60_000)
    settle(page)
    return context, page


@pytest.mark.parametrize("name", list(PAGES))
def test_page_reads_as_an_engineer_reads_it(browser, dashboard_url, name):
    """At 1,280 px after a short run on the real engine: time axes tick in 24-hour UTC, no epoch seconds or
    dict reprs are visible, and each table fits the width with a human column first."""
    path, rendered = PAGES[name]
    context, page = _open(browser, f"{dashboard_url}/{path}")
    try:
        page.locator(rendered).first.wait_for(state="visible", timeout=30_000)
        for labels in page.evaluate(READ_AXES):
            assert labels and all(TIME_LABEL.match(label) for label in labels), labels
        text = page.evaluate(READ_TEXT)
        assert not EPOCH.search(text), EPOCH.search(text).group()
        assert not DICT_REPR.search(text), DICT_REPR.search(text).group()
        for table in page.evaluate(READ_TABLES):
            assert table["right"] <= NARROW["width"], table
            assert table["first"] not in INTERNALS, table
    finally:
        context.close()


DOCS_PAGES = Path(__file__).resolve().parents[2] / "docs" / "screenshots" / "pages"
READ_METRIC = """label => [...document.querySelectorAll('[data-testid="stMetric"]')]
    .filter(m => m.querySelector('[data-testid="stMetricLabel"]')?.innerText.trim() === label)
    .map(m => m.querySelector('[data-testid="stMetricValue"]').innerText.trim())"""


def test_acceptance_page_shows_position_0_beside_the_mean_with_each_definition(browser, dashboard_url, live_collector):
    """Issue 54, as rendered at 1,280 px over the real engine's last hour: conditional acceptance (position 0)
    and acceptance length / (k + 1) beside the mean, the collector's figures, and the definition each
    acceptance threshold uses. The screenshot is docs/screenshots/pages/acceptance.png."""
    context, page = _open(browser, f"{dashboard_url}/acceptance")
    try:
        page.get_by_test_id("stSidebar").get_by_test_id("stSelectbox").first.click()
        page.get_by_role("option", name="last hour").click()
        page.get_by_text("Acceptance by definition", exact=True).wait_for(state="visible", timeout=60_000)
        page.get_by_text("Which definition each threshold uses", exact=True).wait_for(state="visible", timeout=30_000)
        settle(page)
        (position_0,) = page.evaluate(READ_METRIC, "Conditional acceptance (position 0)")
        (mean,) = page.evaluate(READ_METRIC, "Acceptance rate (mean)")
        stored = httpx.get(f"{live_collector['url']}/v1/acceptance/definitions", params={"last": 3600}).json()
        assert position_0 == f"{stored['overall']['conditional_acceptance']:.3f}", (position_0, stored["overall"])
        assert mean == f"{stored['overall']['acceptance_rate']:.3f}", (mean, stored["overall"])
        assert page.evaluate(READ_METRIC, "Acceptance length / (k + 1)"), "no length ratio shown"
        text = page.evaluate(READ_TEXT)
        assert "SpecAcceptanceLow" in text and "acceptance rate (the mean" in text, text[-2000:]
        _check_lost_slices(page, live_collector["url"])
        DOCS_PAGES.mkdir(parents=True, exist_ok=True)
        full_page_screenshot(page, DOCS_PAGES / "acceptance.png", width=NARROW["width"])
    finally:
        context.close()


def _check_lost_slices(page, url: str) -> None:
    """Issue 56: the "Slices that lost acceptance" section renders, saying what the collector found (the
    session's telemetry may all lie in this hour: then nothing is tested against the hour before)."""
    page.get_by_text("Slices that lost acceptance", exact=True).wait_for(state="visible", timeout=30_000)
    found = httpx.get(f"{url}/v1/acceptance/slices", params={"last": 3600}).json()
    text = page.evaluate(READ_TEXT)
    assert f"Tested: {found['tested']:,} slices" in text and "Benjamini-Hochberg" in text, text[-2000:]
    if not found["lost"]:
        assert f"No slice lost acceptance against the window before ({found['tested']:,} slices tested)" in text


def _hourly_records(now: float) -> list[dict]:
    """A request every 30 minutes over the last 23 hours: the window's axis crosses noon or midnight."""
    from collector_payloads import request_dict

    return [request_dict(i, started_at=now - 23 * 3600 + 1800 * i) for i in range(46)]


def test_time_axes_tick_in_24_hour_utc_as_rendered(browser, collector, tmp_path):
    """The ticks Vega renders over a day of telemetry, in a browser whose clock is not UTC: %H:%M, so hours
    past 12 show (a 12-hour clock never shows 13-23), in time order with one wrap at midnight at most, on
    whole UTC hours (the browser's local time would put them at :30)."""
    sent = httpx.post(f"{collector}/v1/ingest", json={"requests": _hourly_records(time.time())}, timeout=30)
    assert sent.status_code == 200, sent.text
    with dashboard(collector, tmp_path / "dashboard.log") as url:
        context, page = _open(browser, url)
        try:
            page.get_by_test_id("stSidebar").get_by_test_id("stSelectbox").first.click()
            page.get_by_role("option", name="last 24 hours").click()
            page.locator(METRIC).first.wait_for(state="visible", timeout=60_000)
            settle(page)
            axes = page.evaluate(READ_AXES)
        finally:
            context.close()
    assert axes, "no time axis rendered"
    for labels in axes:
        assert all(re.fullmatch(r"\d{2}:00", label) for label in labels), labels
        minutes = [int(label[:2]) * 60 + int(label[3:]) for label in labels]
        assert sum(b < a for a, b in zip(minutes, minutes[1:])) <= 1, labels  # one wrap: midnight
        assert max(m // 60 for m in minutes) >= 13, labels
