"""A record's TTFT is the client's (issue 57): from the request's arrival, before its body is read, to the
moment its first chunk with text is handed to the transport; so a slow body or a slow transport (a loaded
host's event loop) counts in it, as it does on the client's clock. The engine's server and the gateway
are each wrapped in an ASGI layer that delays the body and the first chunk with text. A 2-token answer is
decoded whole before its first chunk goes out (its record is held until then: Ticket.hold); a 48-token one
is still decoding when it goes out."""

from __future__ import annotations

import asyncio
import time

import httpx
import pytest
from engine_harness import BackgroundServer
from gateway_harness import GatewayServer

from specwatch.engine.scheduler import SchedulerConfig

BODY_DELAY_S = FIRST_SEND_DELAY_S = 0.5
BODY = {"messages": [{"role": "user", "content": "Say hello."}], "temperature": 0, "stream": True, "ignore_eos": True}


class SlowEdges:
    """Delays the request body's delivery to the app and the answer's first body chunk with text."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        sent_text = False

        async def slow_receive():
            message = await receive()
            if message["type"] == "http.request":
                await asyncio.sleep(BODY_DELAY_S)
            return message

        async def slow_send(message):
            nonlocal sent_text
            if message["type"] == "http.response.body" and b'"content"' in message.get("body", b"") and not sent_text:
                sent_text = True
                await asyncio.sleep(FIRST_SEND_DELAY_S)
            await send(message)

        await self.app(scope, slow_receive, slow_send)


def slowed(server):
    server.server.config.app = SlowEdges(server.server.config.app)  # uvicorn loads the app when it runs
    return server


def client_ttft(url: str, max_tokens: int) -> float:
    """The client's TTFT: from sending the request to reading the first chunk with text (read to its end)."""
    started, first = time.monotonic(), None
    body = {**BODY, "max_tokens": max_tokens}
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=120) as answer:
        assert answer.status_code == 200
        for line in answer.iter_lines():
            compact = line.replace(" ", "")
            if first is None and '"content":"' in compact and '"content":""' not in compact:
                first = time.monotonic() - started
    assert first is not None, "no chunk with text"
    return first


@pytest.mark.parametrize("edge, max_tokens", [("engine", 2), ("engine", 48), ("gateway", 2)])
def test_ttft_counts_a_slow_body_and_a_slow_first_send(bundled_engine, edge, max_tokens):
    engine = BackgroundServer(bundled_engine, SchedulerConfig(slots=1, max_queue=4))
    with slowed(engine) if edge == "engine" else engine as upstream:
        if edge == "engine":
            seen, records = client_ttft(upstream.url, max_tokens), upstream.records
        else:
            with slowed(GatewayServer([f"e={upstream.url}"])) as gateway:
                seen, records = client_ttft(gateway.url, max_tokens), gateway.wait_records(1)
        deadline = time.monotonic() + 30
        while not records and time.monotonic() < deadline:
            time.sleep(0.01)
        record = records[-1]
    # both delays are in the record, as in the client's figure (which adds the loopback and the client's reading)
    assert BODY_DELAY_S + FIRST_SEND_DELAY_S <= record.ttft_s <= seen
    assert record.ttft_s <= record.e2e_s and record.output_tokens == max_tokens
