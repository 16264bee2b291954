"""The monthly report from a collector filled by the real engine (`live_collector`: the bundled
model served with A/B arms, n-gram and early-exit drafts): its figures match the stored rows,
the HTML is well formed with every image embedded, and headless Chromium renders it with no
broken image, the assumptions table and the cost-vs-concurrency plot shown on screen (screenshots:
tests/artifacts/screenshots/report*.png, ignored by git).

Chromium at /usr/bin/chromium and the `playwright` package are needed for the browser test
(`make test` installs Chromium as root; playwright is in the dev extra); no browser is downloaded."""

from __future__ import annotations

import json
import sqlite3
from datetime import UTC, datetime
from pathlib import Path

import pytest
from report_checks import check_html

from specwatch.collector.db import make_db
from specwatch.cost.inputs import load_prices
from specwatch.report.build import build_report, month_window
from specwatch.report.html import write_report

CHROMIUM = Path("/usr/bin/chromium")
SCREENSHOTS = Path(__file__).resolve().parents[1] / "artifacts" / "screenshots"


def stored(db: Path, sql: str, *args) -> list[tuple]:
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return conn.execute(sql, args).fetchall()


@pytest.fixture(scope="module")
def written(live_collector, tmp_path_factory) -> dict:
    db = live_collector["db"]
    ((first,),) = stored(db, "select min(started_at) from requests")
    month = datetime.fromtimestamp(first, UTC).strftime("%Y-%m")
    store_db = make_db(f"sqlite:///{db}")
    try:
        report = build_report(store_db, month, load_prices())
    finally:
        store_db.dispose()
    html, data = write_report(report, tmp_path_factory.mktemp("report"))
    return {"report": report, "html": html, "json": data, "db": db, "month": month}


def test_report_figures_match_the_stored_engine_traffic(written):
    db, report, window = written["db"], written["report"], written["report"].window
    data = json.loads(written["json"].read_text())
    where = "where started_at >= ? and started_at < ?"
    ((requests, errors, out, drafted, accepted),) = stored(
        db,
        f"select count(*), sum(status = 'error'), sum(output_tokens), sum(num_draft_tokens), "
        f"sum(num_accepted_tokens) from requests {where}",
        window.start,
        window.end,
    )
    assert requests >= 20 and data["month"] == written["month"]
    head = data["headline"]
    assert (head["requests"], head["errors"], head["output_tokens"]) == (requests, errors, out)
    assert head["acceptance_rate"] == pytest.approx(accepted / drafted)
    modes = dict(stored(db, f"select mode, count(*) from requests {where} group by mode", window.start, window.end))
    assert {s["key"]: s["requests"] for s in data["traffic"]["by_mode"]} == modes
    drafters = dict(
        stored(
            db, f"select coalesce(drafter, 'none'), count(*) from requests {where} group by 1", window.start, window.end
        )
    )
    assert {s["key"]: s["requests"] for s in data["traffic"]["by_drafter"]} == drafters
    assert sum(d["requests"] for d in data["daily"]) == requests
    arms = {
        a
        for (a,) in stored(
            db, f"select distinct arm from requests {where} and arm is not null", window.start, window.end
        )
    }
    assert data["latency"]["by"] == ("arm" if arms == {"spec", "control"} else "mode")
    ((with_load,),) = stored(
        db, f"select count(*) from requests {where} and load_at_admission is not null", window.start, window.end
    )
    assert sum(b["requests"] for b in data["load"]["buckets"]) == with_load
    assert data["cost"]["source"] == "measured" and data["recommendation"]["action"] in (
        "keep",
        "expand",
        "shrink",
        "disable",
    )
    assert report.window == month_window(written["month"], report.generated_at)


def test_report_html_is_well_formed_and_self_contained(written):
    html = written["html"].read_text()
    images = check_html(html)
    assert len(images) >= 5, "daily trend, acceptance vs length, latency, load, break-even at least"
    for section in ("recommendation", "changes", "traffic", "acceptance", "latency", "load", "alerts", "oom", "cost"):
        assert f'<section id="{section}">' in html
    costs = written["report"].cost
    assert '<div id="assumptions">' in html and all(f"<td>{a.name}</td>" in html for a in costs.tco.assumptions)
    assert costs.concurrency.rows, "the engine's requests carry device time: cost per concurrency level"
    assert 'alt="USD per 1M output tokens against concurrency' in html
    # energy per request is metered (requests.energy_source) or modelled from the device's power (device_samples)
    ((estimated,),) = stored(
        written["db"],
        "select (select count(*) from requests where energy_source = 'estimate') + "
        "(select count(*) from device_samples where power_source = 'estimate')",
    )
    priced = [a.energy_source or "" for a in written["report"].cost.tco.arms]
    assert any("estimate" in s for s in priced) == bool(estimated)
    assert ('class="estimate"' in html) == bool(estimated), "estimated energy must be labelled as such"


def test_report_renders_in_chromium_with_no_broken_image(written):
    if not CHROMIUM.exists():
        pytest.skip(f"Chromium not found at {CHROMIUM}: apt-get install chromium")
    sync_api = pytest.importorskip(
        "playwright.sync_api", reason="the playwright package is not installed: pip install -e '.[dev]'"
    )
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            fetched, errors = [], []
            page.on("request", lambda r: fetched.append(r.url) if not r.url.startswith(("file:", "data:")) else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(written["html"].as_uri(), wait_until="load", timeout=30_000)
            images = page.evaluate(
                """() => [...document.images].map(i => ({alt: i.alt, complete: i.complete,
                                                         width: i.naturalWidth, height: i.naturalHeight}))"""
            )
            assert images and len(images) == len(check_html(written["html"].read_text()))
            broken = [i["alt"] for i in images if not (i["complete"] and i["width"] > 0 and i["height"] > 0)]
            assert not broken, f"broken images: {broken}"
            assert page.locator("h1").inner_text() == f"specwatch monthly report: {written['month']}"
            assert page.locator(".verdict .action").inner_text().lower().endswith("speculation")
            assert not fetched and not errors, (fetched, errors)
            page.screenshot(path=str(SCREENSHOTS / "report.png"), full_page=True)
            for selector, name in (("#assumptions", "assumptions"), ("#concurrency img", "concurrency")):
                shown_on_screen(page, selector, SCREENSHOTS / f"report-{name}.png")
        finally:
            browser.close()
    assert (SCREENSHOTS / "report.png").stat().st_size > 10_000


def shown_on_screen(page, selector: str, path: Path) -> None:
    """Scroll `selector` into view and assert a person sees it: its box starts inside the viewport and
    is not empty, and a screenshot of it (saved to `path`, with one of the viewport beside it) is not
    blank: over 2% of its pixels are darker than the white page."""
    from PIL import Image

    element = page.locator(selector)
    element.evaluate("e => e.scrollIntoView({block: 'start'})")  # its top at the top of the window
    box, view = element.bounding_box(), page.viewport_size
    assert box and box["width"] > 200 and box["height"] > 100, (selector, box)
    assert box["x"] >= 0 and box["x"] + box["width"] <= view["width"], (selector, box)
    assert -1 <= box["y"] < view["height"], (selector, box)  # sub-pixel layout: -0.2 px is at the top
    page.screenshot(path=str(path.with_name(path.stem + "-viewport.png")))
    element.screenshot(path=str(path))
    with Image.open(path) as image:
        grey = image.convert("L")
        dark = sum(grey.histogram()[:200])
    assert dark > 0.02 * grey.width * grey.height, f"{selector}: the screenshot is blank"
