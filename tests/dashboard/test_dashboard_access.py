"""The dashboard over a token-protected collector (a real `specwatch collector serve` process):
it reads with the token of SPECWATCH_READ_TOKEN and never shows it; without a token, or with a
token the collector does not know, every page is a banner saying so, not a traceback."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import orjson
import pytest
from collector_payloads import request_dict
from streamlit.testing.v1 import AppTest

from specwatch.common.procs import free_port, start_collector

APP = str(Path(__file__).resolve().parents[2] / "dashboard" / "app.py")
READ, INGEST = "read-token-7f3a", "ingest-token-c21b"


@pytest.fixture(scope="module")
def secured_collector(tmp_path_factory):
    """A collector with an ingest and a read token, holding ten requests of the last minutes."""
    data = tmp_path_factory.mktemp("secured")
    port = free_port()
    env = {"SPECWATCH_INGEST_TOKEN": INGEST, "SPECWATCH_READ_TOKEN": READ, "SPECWATCH_ALERTS_ENABLED": "false"}
    collector = start_collector(port, data / "collector.log", f"sqlite:///{data / 'specwatch.db'}", env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        now = time.time()
        records = [request_dict(i, started_at=now - 120 + i) for i in range(10)]
        response = httpx.post(
            f"{url}/v1/ingest",
            content=orjson.dumps({"requests": records}),
            headers={"content-type": "application/json", "authorization": f"Bearer {INGEST}"},
        )
        assert response.status_code == 200, response.text
        yield url
    finally:
        collector.terminate()
        collector.wait(30)


def overview(url: str, monkeypatch, token: str | None) -> AppTest:
    monkeypatch.setenv("SPECWATCH_COLLECTOR_URL", url)
    monkeypatch.delenv("SPECWATCH_ADMIN_TOKEN", raising=False)
    if token is None:
        monkeypatch.delenv("SPECWATCH_READ_TOKEN", raising=False)
    else:
        monkeypatch.setenv("SPECWATCH_READ_TOKEN", token)
    from specwatch.dashboard.state import clear_cache

    clear_cache()
    app = AppTest.from_file(APP, default_timeout=60)
    app.run()
    assert not app.exception, [e.value for e in app.exception]
    return app


def shown(app: AppTest) -> str:
    """Every text the page shows (markdown, captions, banners, metrics)."""
    elements = [*app.markdown, *app.caption, *app.error, *app.info, *app.title]
    return "\n".join([str(e.value) for e in elements] + [f"{m.label} {m.value}" for m in app.metric])


def test_with_the_read_token_the_pages_render(secured_collector, monkeypatch):
    app = overview(secured_collector, monkeypatch, READ)
    assert not app.error, [e.value for e in app.error]
    metrics = {m.label: m.value for m in app.metric}
    assert metrics["Speculative share"] == "100%"  # the ten stored requests are shown
    assert READ not in shown(app)


@pytest.mark.parametrize("token", [None, "not-a-token"])
def test_without_a_valid_token_every_page_is_a_banner(secured_collector, monkeypatch, token):
    app = overview(secured_collector, monkeypatch, token)
    assert len(app.error) == 1 and not app.metric
    banner = app.error[0].value
    assert "refused the dashboard's token" in banner and "401" in banner and "SPECWATCH_READ_TOKEN" in banner
    assert token is None or token not in shown(app)
