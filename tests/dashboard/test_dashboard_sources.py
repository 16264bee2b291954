"""The Sources page under Streamlit's AppTest, against a collector holding a real gateway's upstream
snapshots (from `gateway.app.Gateway.emit_upstreams`) and request records: each gateway's upstreams
with their health, and what the page says when no gateway has reported."""

from __future__ import annotations

import time

import httpx
from collector_payloads import request_dict
from gateway_events import upstream_snapshots
from test_dashboard_pages import dashboard_over, open_page


def gateway_snapshots(now: float) -> list[dict]:
    """Gateway "edge": both upstreams up two hours ago, vllm-b down since 90 minutes ago (both
    snapshots older than the page's last-hour window: health is state)."""
    return [e.model_dump() for e in upstream_snapshots([now - 7200, now - 5400])]


def tables(page) -> list:
    return [df.value for df in page.dataframe]


def test_sources_page_shows_a_gateways_upstream_down_with_its_reason(collector, monkeypatch):
    now = time.time()
    records = [request_dict(i, instance="vllm-a", started_at=now - 60 + i) for i in range(3)]
    sent = httpx.post(
        f"{collector}/v1/ingest", json={"requests": records, "events": gateway_snapshots(now)}, timeout=30
    )
    assert sent.status_code == 200, sent.text
    page = open_page(dashboard_over(collector, monkeypatch), "views/sources.py")
    (upstreams,) = [frame for frame in tables(page) if "upstream" in frame]
    shown = {row["upstream"]: row for row in upstreams.to_dict("records")}
    assert shown["vllm-b"]["health"] == "down: connect: connection refused"
    assert (shown["vllm-a"]["health"], shown["vllm-a"]["requests"], shown["vllm-a"]["pool"]) == ("up", 3, "spec")
    assert (shown["vllm-b"]["requests"], shown["vllm-b"]["drafter"]) == (0, "none")
    assert "**edge**: 2 upstreams, 1 down" in [m.value for m in page.markdown]
    assert any("No engine or vLLM server has reported" in info.value for info in page.info)
    assert not any("vllm-a" in set(frame.get("name", [])) for frame in tables(page))  # not listed as an engine


def test_sources_page_says_no_gateway_has_reported(collector, monkeypatch):
    records = [request_dict(i, instance="laptop", started_at=time.time() - 60 + i) for i in range(2)]
    assert httpx.post(f"{collector}/v1/ingest", json={"requests": records}, timeout=30).status_code == 200
    page = open_page(dashboard_over(collector, monkeypatch), "views/sources.py")
    assert "laptop" in set(tables(page)[0]["name"])
    assert any("No gateway has reported; start one with `specwatch gateway serve" in i.value for i in page.info)


def test_sources_page_names_an_instance_that_speculates_on_paper_only(collector, monkeypatch):
    """Speculative-mode records that drafted nothing (a k = 0 schedule) beside ones that drafted: the page
    warns about the first, with when it last drafted, and lists both in the activity table."""
    now = time.time()
    k0 = dict(num_drafts=0, num_draft_tokens=0, num_accepted_tokens=0, accepted_per_position=[0, 0, 0, 0])
    records = [request_dict(i, instance="drafting", started_at=now - 60 + i) for i in range(3)]
    records += [request_dict(10 + i, instance="k0", started_at=now - 60 + i, **k0) for i in range(3)]
    assert httpx.post(f"{collector}/v1/ingest", json={"requests": records}, timeout=30).status_code == 200
    page = open_page(dashboard_over(collector, monkeypatch), "views/sources.py")
    (warning,) = [w.value for w in page.warning]
    assert warning.startswith("**k0** is configured to speculate but drafted on 0.0% of its decode steps")
    assert "last drafted not within a day" in warning
    (activity,) = [frame for frame in tables(page) if "drafted steps" in frame]
    shown = {row["instance"]: row for row in activity.to_dict("records")}
    assert (shown["k0"]["inactive"], shown["drafting"]["inactive"]) == ("yes", "no")
    assert shown["drafting"]["configured by"] == "records"
