"""Driving the dashboard in headless Chromium (tests/dashboard/test_browser.py, the Requests page after a
drafter switch in tests/alerts/test_regression_real_engine.py): Chromium at /usr/bin/chromium through
the `playwright` package, no browser downloaded; a Streamlit server over a collector; waiting until a
page has rendered; full-page screenshots."""

from __future__ import annotations

import contextlib
import importlib.util
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from specwatch.common.procs import free_port

CHROMIUM = Path("/usr/bin/chromium")
VIEWPORT = {"width": 1440, "height": 900}


def browser_missing() -> str | None:
    """Why no Chromium test can run here (a skip reason naming the fix), or None."""
    if not CHROMIUM.exists():
        return f"Chromium not found at {CHROMIUM}: apt-get install chromium"
    if importlib.util.find_spec("playwright") is None:
        return "the playwright package is not installed: pip install -e '.[dev]'"
    return None


@contextmanager
def chromium() -> Iterator:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            yield browser
        finally:
            browser.close()


@contextmanager
def dashboard(collector_url: str, log: Path) -> Iterator[str]:
    """A Streamlit dashboard over `collector_url`: its base URL."""
    from specwatch.dashboard.launch import start_dashboard

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


def settle(page) -> None:
    """Until the script run is over and the charts are drawn (or a short timeout: the checks still run)."""
    from playwright.sync_api import TimeoutError as Timeout

    with contextlib.suppress(Timeout):  # the websocket stays open; idle is best effort
        page.wait_for_load_state("networkidle", timeout=10_000)
    with contextlib.suppress(Timeout):  # "Running..." in the top bar while the script runs
        page.locator('[data-testid="stStatusWidget"]').wait_for(state="detached", timeout=15_000)
    with contextlib.suppress(Timeout):  # Vega charts render into a canvas or svg once their data arrived
        page.wait_for_function(
            """() => [...document.querySelectorAll('[data-testid="stVegaLiteChart"]')]
                                         .every(c => c.querySelector('canvas, svg'))""",
            timeout=10_000,
        )
    page.wait_for_timeout(750)


def full_page_screenshot(page, path: Path, width: int = VIEWPORT["width"]) -> None:
    """Streamlit scrolls inside its own container, so `full_page` alone would give one screen:
    grow the viewport to the content's height first (keeping `width`)."""
    height = page.evaluate("""() => Math.max(document.body.scrollHeight,
        ...[...document.querySelectorAll('[data-testid="stMain"], [data-testid="stAppViewContainer"], section.main')]
           .map(e => e.scrollHeight))""")
    if height > VIEWPORT["height"]:
        page.set_viewport_size({"width": width, "height": min(int(height) + 40, 8000)})
        page.wait_for_timeout(500)
    page.screenshot(path=str(path), full_page=True)
