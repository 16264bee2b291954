"""The gateway in front of the bundled engine (two real upstreams: one speculating with n-gram
drafts, one decoding plainly): records match the engine's own, responses are unchanged, the
canary split, the control API, and the alert remediation driving the gateway."""

from __future__ import annotations

import asyncio
import math
import time
from pathlib import Path

import httpx
import orjson
import pytest
from engine_harness import spec_and_plain
from gateway_harness import GatewayServer
from sqlalchemy import select
from waiting import wait_for

from specwatch.alerts.rules import parse_config
from specwatch.alerts.runner import AlertRunner
from specwatch.alerts.tables import alert_actions
from specwatch.collector.db import make_db, upgrade
from specwatch.collector.ingest.store import Store
from specwatch.collector.models import Request
from specwatch.common.procs import free_port, start_collector, stop_process
from specwatch.gateway.routing import RoutingConfig
from specwatch.telemetry.client import TelemetryClient
from specwatch.telemetry.schema import IngestBatch

REPEAT = "Repeat exactly: the quick brown fox jumps over the lazy dog. the quick brown fox jumps over the lazy dog."
TOKEN = {"authorization": "Bearer gw-token"}


@pytest.fixture(scope="module")
def upstreams(bundled_engine):
    """(spec engine, plain engine) over the one bundled model."""
    with spec_and_plain(bundled_engine) as pair:
        yield pair


def pools(upstreams) -> list[str]:
    spec, plain = upstreams
    return [f"spec1={spec.url},drafter=ngram,gamma=8", f"plain1={plain.url}"]


def chat(url: str, stream: bool = False, **extra) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": REPEAT}], "max_tokens": 24, "temperature": 0, **extra}
    return httpx.post(f"{url}/v1/chat/completions", json={**body, "stream": stream}, timeout=120)


def test_records_match_the_engines_own_and_responses_are_unchanged(upstreams):
    spec, _ = upstreams
    with GatewayServer(pools(upstreams)) as gw:
        for n, stream in enumerate([False, True, True]):
            extra = {"stream_options": {"include_usage": True}} if n == 2 else {}
            direct, through = chat(spec.url, stream, **extra), chat(gw.url, stream, **extra)
            assert through.status_code == 200 and through.headers["x-specwatch-upstream"] == "spec1"
            assert _text(through, stream) == _text(direct, stream)  # greedy: the same reply, relayed unchanged
            engine_record, record = spec.records[-1], gw.wait_records(n + 1)[-1]
            assert record.mode == "speculative" and record.drafter == "ngram" and record.draft_counts_known
            for field in ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "accepted_per_position", "gamma"):
                assert getattr(record, field) == getattr(engine_record, field), field
            assert record.num_accepted_tokens > 0
            assert (record.prompt_tokens, record.output_tokens) == (
                engine_record.prompt_tokens,
                engine_record.output_tokens,
            )
            assert record.e2e_s >= engine_record.e2e_s - engine_record.queue_s
            assert record.ttft_s is not None and record.ttft_s <= record.e2e_s
            assert record.queue_s == pytest.approx(engine_record.queue_s, abs=1e-6)


def _text(response: httpx.Response, stream: bool) -> str:
    if not stream:
        return response.json()["choices"][0]["message"]["content"]
    events = [line[6:] for line in response.text.split("\n\n") if line.startswith("data: {")]
    chunks = [orjson.loads(e) for e in events]
    return "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c.get("choices"))


def test_the_plain_pool_records_autoregressive(upstreams):
    _, plain = upstreams
    with GatewayServer(pools(upstreams), RoutingConfig(long_prompt_tokens=10)) as gw:
        response = chat(gw.url)  # the prompt is over 10 tokens: the plain pool
        assert response.headers["x-specwatch-upstream"] == "plain1"
        record, engine_record = gw.wait_records(1)[0], plain.records[-1]
        assert (record.mode, record.mode_reason, record.drafter) == ("autoregressive", "long_prompt", None)
        assert engine_record.mode == "autoregressive" and record.num_drafts == 0 and record.draft_counts_known


def test_canary_split_over_400_requests_is_within_binomial_bounds_and_sticky(upstreams):
    async def send(client: httpx.AsyncClient, url: str, user: str) -> str:
        body = {"prompt": "Hi", "max_tokens": 1, "temperature": 0, "user": user}
        response = await client.post(f"{url}/v1/completions", json=body)
        assert response.status_code == 200
        return response.headers["x-specwatch-upstream"]

    async def run(url: str, users: list[str]) -> list[str]:
        limit = asyncio.Semaphore(8)
        async with httpx.AsyncClient(timeout=120) as client:

            async def one(user: str) -> str:
                async with limit:
                    return await send(client, url, user)

            return await asyncio.gather(*(one(u) for u in users))

    with GatewayServer(pools(upstreams), RoutingConfig(canary=0.3, load_off=1000, load_on=999)) as gw:
        users = [f"user-{i}" for i in range(400)]
        served = asyncio.run(run(gw.url, users))
        share = served.count("spec1") / len(served)
        bound = 3.29 * math.sqrt(0.3 * 0.7 / 400)  # 99.9%
        assert abs(share - 0.3) < bound, share
        records = gw.wait_records(400)
        assert {(r.arm, r.tags["upstream"]) for r in records} == {("spec", "spec1"), ("control", "plain1")}
        assert {r.instance for r in records} == {"test"}  # both upstreams here serve one engine, instance "test"
        assert all(r.mode_reason == "canary" for r in records)
        again = asyncio.run(run(gw.url, users[:50]))
        assert again == served[:50]  # the same user lands in the same arm


def test_control_api_switches_the_gateway_and_refuses_without_the_token(upstreams):
    with GatewayServer(pools(upstreams), control_token="gw-token") as gw:
        url = f"{gw.url}/v1/control/mode"
        assert httpx.post(url, json={"mode": "autoregressive"}).status_code == 401
        assert httpx.post(url, json={"mode": "sideways"}, headers=TOKEN).status_code == 400
        state = httpx.post(url, json={"mode": "autoregressive"}, headers=TOKEN).json()
        assert (state["override"], state["override_reason"]) == ("autoregressive", "manual")
        assert {u["name"] for u in state["upstreams"]} == {"spec1", "plain1"}
        assert chat(gw.url).headers["x-specwatch-upstream"] == "plain1"
        assert gw.wait_records(1)[0].mode_reason == "manual"
        httpx.post(url, json={"mode": "auto"}, headers=TOKEN)
        assert chat(gw.url).headers["x-specwatch-upstream"] == "spec1"
        defrag = httpx.post(f"{gw.url}/v1/control/defragment", headers=TOKEN)
        assert defrag.status_code == 409 and "not applicable to a gateway" in defrag.json()["error"]["message"]
    with GatewayServer(pools(upstreams)) as gw:  # no token configured: the control API is off
        assert httpx.post(f"{gw.url}/v1/control/mode", json={"mode": "auto"}, headers=TOKEN).status_code == 403


def test_an_alert_on_gateway_records_falls_back_through_the_gateway_and_restores(upstreams, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECWATCH_TEST_GW_TOKEN", "gw-token")
    db = make_db(f"sqlite:///{tmp_path / 'alerts.db'}")
    upgrade(db)
    # min_acceptance 0: the gateway's own low-acceptance fallback stays out of this test's way
    with GatewayServer(pools(upstreams), RoutingConfig(min_acceptance=0.0), control_token="gw-token") as gw:
        rule = {
            **{"name": "SpecAcceptanceLow", "signal": "acceptance_rate", "op": "<", "threshold": 0.99},
            **{"window": "5m", "for": "0s", "min_samples": 3, "group_by": ["instance"]},
            "actions": ["fallback_autoregressive"],
        }
        # records carry the engine's own instance ("test"): the remediation sends that instance's action to the
        # gateway in front of it, which switches its routing
        remediation = {"cooldown": "90s", "token_env": "SPECWATCH_TEST_GW_TOKEN", "engines": {"test": gw.url}}
        config = parse_config({"rules": [rule], "remediation": remediation})
        for n in range(4):  # open-ended prompts: n-gram drafts are mostly rejected
            body = {"prompt": f"Write a sentence about the number {n}.", "max_tokens": 16, "temperature": 0}
            assert httpx.post(f"{gw.url}/v1/completions", json=body, timeout=120).status_code == 200
        Store(db).insert(IngestBatch(requests=gw.wait_records(4)))
        assert sum(r.num_accepted_tokens for r in gw.records) < 0.99 * sum(r.num_draft_tokens for r in gw.records)
        runner = AlertRunner(db, config)
        now = time.time() + 1
        report = runner.cycle(now)
        assert [(a.action, a.outcome) for a in report.actions] == [("fallback_autoregressive", "ok")]
        assert chat(gw.url).headers["x-specwatch-upstream"] == "plain1"
        assert gw.wait_records(5)[-1].mode_reason == "alert"
        report = runner.cycle(now + 400)  # the requests left the window: resolved, restored
        assert [(a.action, a.outcome) for a in report.actions] == [("restore_speculative", "ok")]
        assert chat(gw.url).headers["x-specwatch-upstream"] == "spec1"
        runner.close()
    with db.connect() as conn:
        actions = conn.execute(select(alert_actions.c.action, alert_actions.c.instance, alert_actions.c.outcome)).all()
    assert [tuple(a) for a in actions] == [
        ("fallback_autoregressive", "test", "ok"),
        ("restore_speculative", "test", "ok"),
    ]


def test_load_on_the_spec_pool_sends_requests_to_the_plain_pool(upstreams):
    with GatewayServer(pools(upstreams), RoutingConfig(cooldown_s=0.0)) as gw:
        gw.gateway.states["spec1"].in_flight = 7  # 7 of its 8 seats taken by other requests: load 0.875
        response = chat(gw.url, max_tokens=4)
        gw.gateway.states["spec1"].in_flight -= 7
        assert response.headers["x-specwatch-upstream"] == "plain1"
        record = gw.wait_records(1)[0]
        assert (record.mode_reason, record.tags["upstream"]) == ("load", "plain1")


def test_records_reach_a_collector_that_starts_late_spooled_not_lost(upstreams, tmp_path):
    port = free_port()
    collector_url = f"http://127.0.0.1:{port}"
    client = TelemetryClient(collector_url, tmp_path / "spool", flush_interval_s=0.2, retries=1)
    try:
        with GatewayServer(pools(upstreams), RoutingConfig(canary=0.5), client=client, name="edge") as gw:
            for n in range(6):
                body = {"prompt": REPEAT, "max_tokens": 6, "temperature": 0, "user": f"u{n}"}
                assert httpx.post(f"{gw.url}/v1/completions", json=body, timeout=120).status_code == 200
            sent = {r.request_id: r for r in gw.wait_records(6)}
            wait_for(lambda: client.stats().spooled >= 1, "the records to be spooled while the collector is down")
            collector = start_collector(port, tmp_path / "collector.log", f"sqlite:///{tmp_path / 'sw.db'}")
            try:
                stored = wait_for(lambda: _stored(tmp_path / "sw.db", 6), "the spooled records to be delivered")
                events = httpx.get(f"{collector_url}/v1/events", params={"last": 3600}).json()
            finally:
                stop_process(collector)
    finally:
        client.close()
    assert {r["request_id"]: (r["instance"], r["arm"]) for r in stored} == {
        i: (r.instance, r.arm) for i, r in sent.items()
    }
    assert {e["kind"] for e in events if e["instance"] == "edge"} >= {"config", "upstream"}


def _stored(db: Path, n: int) -> list[dict] | None:
    if not db.exists():
        return None
    store_db = make_db(f"sqlite:///{db}")
    try:
        with store_db.connect() as conn:
            rows = conn.execute(select(Request.request_id, Request.instance, Request.arm)).mappings().all()
    except Exception:  # not migrated yet
        return None
    finally:
        store_db.dispose()
    return [dict(r) for r in rows] if len(rows) >= n else None
