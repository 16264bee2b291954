"""The Requests page under AppTest against a real collector: the listing with its filters and keyset
pages, one request opened, and deploy markers on the Overview and Acceptance time charts."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path

import httpx
import orjson
import pytest
from collector_payloads import event_dict, request_dict
from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py")
N = 60


@pytest.fixture
def filled(collector, tmp_path):
    """60 requests over the last 10 minutes (q59 the newest), two flags, a deploy marker."""
    now = time.time()
    records = [
        request_dict(i, request_id=f"q{i:02d}", started_at=now - 600 + 10 * i, status="error" if i == 7 else "ok")
        for i in range(N)
    ]
    marker = event_dict(0, at=now - 300, kind="config", detail={"drafter": "early-exit:4"})
    body = orjson.dumps({"requests": records, "samples": [], "events": [marker]})
    response = httpx.post(f"{collector}/v1/ingest", content=body, headers={"content-type": "application/json"})
    assert response.status_code == 200, response.text
    with sqlite3.connect(tmp_path / "specwatch.db") as conn:
        conn.executemany(
            "insert into request_flags values (?, ?, ?, 'gpu-0', 'smollm2-135m', 'ngram', 0.0, 0.6, '{}', ?)",
            [("q03", "collapse", now - 570, now), ("q03", "outlier", now - 570, now)],
        )
    return collector


@pytest.fixture
def app(filled, monkeypatch):
    monkeypatch.setenv("SPECWATCH_COLLECTOR_URL", filled)
    from specwatch.dashboard.state import clear_cache

    clear_cache()
    return AppTest.from_file(APP, default_timeout=60)


def shown(app: AppTest) -> list[str]:
    assert not app.exception, [e.value for e in app.exception]
    return list(app.dataframe[0].value["request_id"])


def open_requests(app: AppTest) -> AppTest:
    app.run()
    app.switch_page("views/requests.py").run()
    return app


def test_pages_forward_and_back(app):
    open_requests(app)
    assert shown(app) == [f"q{i:02d}" for i in range(N - 1, N - 51, -1)]  # newest first, 50 a page
    app.button(key="page_next").click().run()
    assert shown(app) == [f"q{i:02d}" for i in range(N - 51, -1, -1)]
    assert app.button(key="page_next").disabled
    app.button(key="page_back").click().run()
    assert shown(app)[0] == "q59"


@pytest.mark.parametrize(
    ("key", "choice", "expected"),
    [("requests_flag", "collapse", ["q03"]), ("requests_status", "error", ["q07"])],
)
def test_filters(app, key, choice, expected):
    open_requests(app)
    app.selectbox(key=key).select(choice).run()
    assert shown(app) == expected


def test_sort_by_ttft_then_open_one(app):
    open_requests(app)
    app.selectbox(key="requests_sort").select("TTFT highest first").run()
    ids = shown(app)
    assert ids[:6] == ["q59", "q49", "q39", "q29", "q19", "q09"]  # ttft 0.05 + (i % 10) / 100: ties by id
    app.selectbox(key="requests_flag").select("any").run()
    app.selectbox(key="requests_open").select("q03").run()
    assert not app.exception, [e.value for e in app.exception]
    metrics = {m.label: m.value for m in app.metric}
    assert metrics["acceptance"] == f"{(4 + 3 + 2 + 1) / 16:.3f}" and metrics["output tokens"] == "64"
    flags = app.dataframe[-1].value
    assert list(flags["flag"]) == ["collapse", "outlier"]


@pytest.mark.parametrize("page", ["views/overview.py", "views/acceptance.py"])
def test_deploy_markers_on_time_charts(app, page):
    app.run()
    app.switch_page(page).run()
    assert not app.exception and not app.error
    layers = [layer for c in app.get("vega_lite_chart") for layer in json.loads(c.proto.spec).get("layer", [])]
    rules = [layer for layer in layers if layer.get("mark", {}).get("strokeDash") == [2, 2]]
    assert rules and all(r["mark"]["type"] == "rule" for r in rules)
