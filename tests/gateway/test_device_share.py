"""The gateway's device time per request: processor sharing over its own requests in flight at
each upstream (1/n of every interval with n in flight), by hand and through a real gateway."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import pytest
from gateway_harness import GatewayServer, outcome
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from thread_server import ThreadServer

from specwatch.gateway.upstreams import ProcessorSharing


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_two_overlapping_requests_share_the_time_they_are_in_flight_together():
    clock = Clock()
    sharing = ProcessorSharing(clock)
    a = sharing.enter()  # A alone 0-2 s
    clock.now += 2
    b = sharing.enter()  # A and B 2-6 s
    clock.now += 4
    share_a = sharing.leave(a)  # B alone 6-7 s
    clock.now += 1
    share_b = sharing.leave(b)
    assert (share_a, share_b) == (4.0, 3.0)
    assert sharing.in_flight == 0


def test_idle_time_is_nobodys_and_three_at_once_get_a_third_each():
    clock = Clock()
    sharing = ProcessorSharing(clock)
    clock.now += 50  # idle: charged to no one
    marks = [sharing.enter() for _ in range(3)]
    clock.now += 3
    assert [sharing.leave(mark) for mark in marks] == [1.0, 1.0, 1.0]
    with pytest.raises(RuntimeError, match="without a matching enter"):
        sharing.leave(0.0)


def test_the_record_carries_the_share_labelled_processor_sharing():
    record = outcome(instance="p", drafter=None, e2e_s=2.0, device_s=1.25).record()
    assert (record.device_s, record.device_s_source) == (1.25, "processor_sharing")
    never_sent = outcome(instance="p", drafter=None, e2e_s=2.0).record()
    assert (never_sent.device_s, never_sent.device_s_source) == (None, None)


def slow_upstream() -> Starlette:
    """Answers each completion after `sleep` seconds; `app.state.served` gets (arrived, answered) per request."""

    async def complete(request: Request) -> Response:
        arrived = time.monotonic()
        body = await request.json()
        await asyncio.sleep(float(body["sleep"]))
        request.app.state.served.append((arrived, time.monotonic()))
        usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
        return JSONResponse({"object": "text_completion", "choices": [{"index": 0, "text": "ok"}], "usage": usage})

    app = Starlette(
        routes=[
            Route("/v1/completions", complete, methods=["POST"]),
            Route("/health", lambda request: Response(b""), methods=["GET"]),
            Route("/metrics", lambda request: Response(b"vllm:num_requests_running 0\n"), methods=["GET"]),
        ]
    )
    app.state.served = []
    return app


def union_s(intervals: list[tuple[float, float]]) -> float:
    total, reach = 0.0, float("-inf")
    for start, end in sorted(intervals):
        total += max(0.0, end - max(start, reach))
        reach = max(reach, end)
    return total


def test_two_concurrent_requests_to_one_slow_upstream_split_the_union_of_their_intervals():
    app = slow_upstream()
    with ThreadServer(app) as upstream, GatewayServer([f"slow={upstream.url}"]) as gw:
        seen_by_client: list[tuple[float, float]] = []

        def ask(delay_s: float, sleep_s: float) -> None:
            time.sleep(delay_s)
            started = time.monotonic()
            response = httpx.post(f"{gw.url}/v1/completions", json={"prompt": "x", "sleep": sleep_s}, timeout=30)
            seen_by_client.append((started, time.monotonic()))
            assert response.status_code == 200, response.text

        threads = [threading.Thread(target=ask, args=args) for args in ((0.0, 0.6), (0.3, 0.6))]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        records = gw.wait_records(2)
    shares = [r.device_s for r in records]
    # the gateway's in-flight intervals lie inside the client's and contain the upstream's
    inner, outer = union_s(app.state.served), union_s(seen_by_client)
    assert inner - 0.01 <= sum(shares) <= outer + 0.01, (shares, inner, outer)
    assert 0.8 < sum(shares) < 1.3  # 0.9 s of union plus loopback overheads
    for record in records:
        assert record.device_s_source == "processor_sharing"
        assert 0 < record.device_s <= record.e2e_s
