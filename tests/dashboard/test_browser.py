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

import contextlib
import subprocess
from contextlib import contextmanager
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
if not CHROMIUM.exists():
    pytest.skip(f"Chromium not found at {CHROMIUM}: apt-get install chromium", allow_module_level=True)
sync_api = pytest.importorskip(
    "playwright.sync_api", reason="the playwright package is not installed: pip install -e '.[dev]'"
)

from common.procs import free_port  # noqa: E402
from dashboard.launch import start_dashboard  # noqa: E402

SCREENSHOTS = Path(__file__).resolve().parents[1] / "artifacts" / "screenshots"
VIEWPORT = {"width": 1440, "height": 900}
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
}


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        chromium = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            yield chromium
        finally:
            chromium.close()


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


@contextmanager
def dashboard(collector_url: str, log: Path):
    port = free_port()
    process = start_dashboard(port, collector_url, log)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(10)


def sidebar_filters(page):
    """The global filters app.py draws in the sidebar before running the page."""
    return page.get_by_test_id("stSidebar").get_by_text("Time window", exact=True)


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


def settle(page) -> None:
    """Until the script run is over and the charts are drawn (or a short timeout: the checks still run)."""
    with contextlib.suppress(sync_api.TimeoutError):  # the websocket stays open; idle is best effort
        page.wait_for_load_state("networkidle", timeout=10_000)
    with contextlib.suppress(sync_api.TimeoutError):  # "Running..." in the top bar while the script runs
        page.locator('[data-testid="stStatusWidget"]').wait_for(state="detached", timeout=15_000)
    with contextlib.suppress(sync_api.TimeoutError):  # Vega charts render into a canvas or svg once their data arrived
        page.wait_for_function(
            """() => [...document.querySelectorAll('[data-testid="stVegaLiteChart"]')]
                                         .every(c => c.querySelector('canvas, svg'))""",
            timeout=10_000,
        )
    page.wait_for_timeout(750)


def full_page_screenshot(page, path: Path) -> None:
    """Streamlit scrolls inside its own container, so `full_page` alone would give one screen:
    grow the viewport to the content's height first."""
    height = page.evaluate("""() => Math.max(document.body.scrollHeight,
        ...[...document.querySelectorAll('[data-testid="stMain"], [data-testid="stAppViewContainer"], section.main')]
           .map(e => e.scrollHeight))""")
    if height > VIEWPORT["height"]:
        page.set_viewport_size({"width": VIEWPORT["width"], "height": min(int(height) + 40, 8000)})
        page.wait_for_timeout(500)
    page.screenshot(path=str(path), full_page=True)
