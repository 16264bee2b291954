"""Issue 53: every string a producer wrote is shown as text on the dashboard, never read as Markdown or
HTML. Under AppTest against a real collector: a deploy marker's version on the Tuning page, a request id
on the Requests page, a gateway's name on the Sources page. The rule is one: such a string goes into a
Markdown-reading element (markdown, caption, subheader, warning, metric help) through
`formats.as_markdown_text`, which escapes every character Markdown (or Streamlit's LaTeX) reads."""

from __future__ import annotations

import time

import httpx
from collector_payloads import event_dict, request_dict
from gateway_events import upstream_snapshots
from test_dashboard_pages import dashboard_over, open_page
from tuning_payloads import records

from specwatch.dashboard.formats import as_markdown_text

# a ping, a disguised link, raw HTML and LaTeX, within the collector's 64 characters of a version
HOSTILE = "<!channel> **Re-auth** [now](https://evil.example) <b>x</b> $1$"
NO_SLASH = HOSTILE.replace("/", "")  # an id with "/" cannot be opened yet (issue 53, item 7)


def ingest(collector: str, **batch) -> None:
    sent = httpx.post(f"{collector}/v1/ingest", json=batch, timeout=30)
    assert sent.status_code == 200, sent.text


def texts(page) -> list[str]:
    """The Markdown source of every element that renders Markdown."""
    elements = [*page.markdown, *page.caption, *page.subheader, *page.warning, *page.info]
    return [e.value for e in elements]


def shown_as_text(page, raw: str) -> None:
    found = texts(page)
    assert any(as_markdown_text(raw) in t for t in found), found
    assert not any(raw in t for t in found), [t for t in found if raw in t]  # never unescaped


def test_a_deploy_markers_version_is_text_on_the_tuning_page(collector, monkeypatch):
    now = time.time()
    rows = records(now - 1500)
    end = max(r["started_at"] + r["e2e_s"] for r in rows)
    markers = [
        event_dict(0, instance="gpu-0", at=end - 1, kind="config", detail={"version": "0.32.0"}),
        event_dict(1, instance="gpu-0", at=end + 5, kind="config", detail={"version": HOSTILE}),
    ]
    ingest(collector, requests=rows, events=markers)
    page = open_page(dashboard_over(collector, monkeypatch), "views/tuning.py")
    assert any("Stale" in w.value for w in page.warning), texts(page)
    shown_as_text(page, HOSTILE)


def test_a_request_id_is_text_on_the_requests_page(collector, monkeypatch):
    ingest(collector, requests=[request_dict(0, request_id=NO_SLASH, started_at=time.time() - 60)])
    app = dashboard_over(collector, monkeypatch)
    app.run()
    app.switch_page("views/requests.py").run()
    app.selectbox(key="requests_open").select(NO_SLASH).run()
    assert not app.exception and not app.error, [e.value for e in (*app.exception, *app.error)]
    assert any(s.value == f"Request {as_markdown_text(NO_SLASH)}" for s in app.subheader), texts(app)
    shown_as_text(app, NO_SLASH)


def test_a_gateways_name_is_text_on_the_sources_page(collector, monkeypatch):
    now = time.time()
    snapshots = [e.model_copy(update={"instance": HOSTILE}).model_dump() for e in upstream_snapshots([now - 60])]
    ingest(collector, events=snapshots)
    page = open_page(dashboard_over(collector, monkeypatch), "views/sources.py")
    assert f"**{as_markdown_text(HOSTILE)}**: 2 upstreams, 0 down" in [m.value for m in page.markdown], texts(page)
    shown_as_text(page, HOSTILE)
