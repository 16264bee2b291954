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

from pathlib import Path

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
