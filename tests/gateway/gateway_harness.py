"""A gateway on a free loopback port in a background thread, for tests and benchmarks; and a
misbehaving OpenAI upstream (real HTTP, real sockets) for the fault tests."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import orjson
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from thread_server import ThreadServer

from specwatch.gateway.app import create_app
from specwatch.gateway.core import Gateway, GatewaySettings
from specwatch.gateway.records import Outcome
from specwatch.gateway.routing import Router, RoutingConfig
from specwatch.gateway.upstreams import parse_upstream
from specwatch.telemetry.client import TelemetryClient
from specwatch.telemetry.schema import RequestRecord
from specwatch.telemetry.sink import TelemetrySink
from specwatch.telemetry.spans import RequestSpans


class GatewayServer(ThreadServer):
    """`records`: every finished request's RequestRecord, in finishing order (a consumer of the
    gateway's sink, whose collector client is `telemetry`)."""

    def __init__(
        self,
        upstreams: list[str],
        routing: RoutingConfig = RoutingConfig(),
        client: TelemetryClient | None = None,
        seed: int | None = 0,
        spans: RequestSpans | None = None,
        **settings,
    ) -> None:
        settings = GatewaySettings(**{"health_interval_s": 0.2, **settings})
        sink = TelemetrySink(settings.name, client, spans)
        self.gateway = Gateway([parse_upstream(u) for u in upstreams], Router(routing, seed), settings, sink)
        self.records: list[RequestRecord] = []
        sink.subscribe(RequestRecord, self.records.append)
        super().__init__(create_app(self.gateway))

    def wait_records(self, n: int, timeout_s: float = 30.0) -> list[RequestRecord]:
        deadline = time.monotonic() + timeout_s
        while len(self.records) < n and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(self.records) >= n, f"{len(self.records)} records, expected {n}"
        return self.records


CHUNK = b'data: {"id":"x","object":"chat.completion.chunk","choices":[{"index":0,"delta":{"content":"hi"}}]}\n\n'


def faulty_upstream() -> Starlette:
    """An OpenAI-shaped upstream whose answer the request's `prompt` chooses: 'fail500', 'malformed',
    'huge' (a 3 MB body), 'break' (a stream cut off mid-way: the connection drops), 'lingering' (a whole stream,
    3 chunks, usage and [DONE], whose connection stays open 2 s after [DONE]), 'slow' (a stream of
    200 chunks, 20 ms apart; `app.state.slow_sent` gets how many it sent once it ended), 'stall' (a normal
    reply after 1.5 s), 'cookie' (a normal reply setting a cookie),
    'large' (a whole answer of about the request's `size` bytes, sent in 1 MiB chunks
    without a content-length, usage and metrics after `choices`: see `large_answer`), else a normal small reply.
    `/health` answers after `app.state.health_delay_s`."""

    async def complete(request: Request) -> Response:
        body = await request.json()
        kind = body.get("prompt")
        request.app.state.seen.append({"headers": dict(request.headers), "body": body})
        if kind == "fail500":
            return JSONResponse({"error": {"message": "upstream exploded", "type": "server_error"}}, status_code=500)
        if kind == "huge":
            return JSONResponse({"choices": [{"index": 0, "text": "x" * 3_000_000}]})
        if kind == "large":
            return StreamingResponse(large_answer(body["size"]), media_type="application/json")
        if kind == "malformed":
            return Response(b"<html>proxy error</html>", media_type="application/json")
        if kind == "break":
            return StreamingResponse(_broken_stream(), media_type="text/event-stream")
        if kind == "stall":  # answers after 1.5 s
            await asyncio.sleep(1.5)
        if kind == "slow":
            return StreamingResponse(_slow_stream(request.app.state), media_type="text/event-stream")
        if kind == "lingering":
            return StreamingResponse(_lingering_stream(), media_type="text/event-stream")
        usage = {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}
        answer = JSONResponse({"object": "text_completion", "choices": [{"index": 0, "text": "ok"}], "usage": usage})
        if kind == "cookie":  # an upstream that sets a session cookie
            answer.set_cookie("upstream_session", "secret-of-one-client")
        return answer

    app = Starlette(
        routes=[
            Route("/v1/completions", complete, methods=["POST"]),
            Route("/health", _health, methods=["GET"]),
            Route("/metrics", lambda request: Response(b"vllm:num_requests_running 0\n"), methods=["GET"]),
        ]
    )
    app.state.seen, app.state.slow_sent, app.state.health_delay_s = [], [], 0.0
    return app


LARGE_USAGE = {"prompt_tokens": 5, "completion_tokens": 4096, "total_tokens": 4101}
LARGE_SPEC = {"acceptance_histogram": [1, 2, 3], "num_draft_tokens": 12, "num_spec_steps": 6}
# text that looks like the keys the gateway reads: inside a JSON string its quotes are escaped
DECOY = 'say "usage": {"prompt_tokens": 99}, "metrics": {} ' * 8


async def large_answer(size: int):
    """A completion of about `size` bytes as vLLM orders it: choices, then usage and metrics."""
    yield b'{"id":"big","object":"text_completion","choices":[{"index":0,"text":"' + orjson.dumps(DECOY)[1:-1]
    for sent in range(0, size, 1 << 20):
        yield b"x" * min(1 << 20, size - sent)
        await asyncio.sleep(0)
    tail = {"usage": LARGE_USAGE, "metrics": {"time_to_first_token_ms": 12.0, "speculative_decoding": LARGE_SPEC}}
    yield b'","finish_reason":"length"}],' + orjson.dumps(tail)[1:]


async def _health(request: Request) -> Response:
    await asyncio.sleep(request.app.state.health_delay_s)
    return Response(b"")


async def _broken_stream():
    yield CHUNK
    await asyncio.sleep(0.05)
    raise RuntimeError("the upstream process died")  # uvicorn drops the connection mid-body


async def _lingering_stream():
    for _ in range(3):
        yield CHUNK
    usage = {"prompt_tokens": 2, "completion_tokens": 3, "total_tokens": 5}
    yield b"data: " + orjson.dumps({"id": "x", "choices": [], "usage": usage}) + b"\n\ndata: [DONE]\n\n"
    await asyncio.sleep(2.0)  # an engine whose closing lags behind its [DONE]: the client has left by then


async def _slow_stream(state):
    sent = 0
    try:
        while sent < 200:
            yield CHUNK
            sent += 1
            await asyncio.sleep(0.02)
        yield b"data: [DONE]\n\n"
    finally:
        state.slow_sent.append(sent)


class DroppingUpstream:
    """A raw HTTP/1.1 server that drops the first POST's connection without answering (what a
    kept-alive connection the server closed while idle looks like to the client), then answers."""

    REPLY = (
        b'{"object":"text_completion","choices":[{"index":0,"text":"ok"}],'
        b'"usage":{"prompt_tokens":1,"completion_tokens":1}}'
    )

    def __init__(self) -> None:
        self.socket = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.socket.getsockname()[1]}"
        self.posts = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self.socket.accept()
            except OSError:
                return
            threading.Thread(target=self._connection, args=(conn,), daemon=True).start()

    def _connection(self, conn: socket.socket) -> None:
        with conn:
            buffer = b""
            while True:
                while b"\r\n\r\n" not in buffer:
                    data = conn.recv(65536)
                    if not data:
                        return
                    buffer += data
                head, _, buffer = buffer.partition(b"\r\n\r\n")
                length = next(
                    (
                        int(line.split(b":")[1])
                        for line in head.split(b"\r\n")
                        if line.lower().startswith(b"content-length:")
                    ),
                    0,
                )
                while len(buffer) < length:
                    buffer += conn.recv(65536)
                buffer = buffer[length:]
                if head.startswith(b"POST"):
                    self.posts += 1
                    if self.posts == 1:
                        return  # closed without a word
                body = self.REPLY if head.startswith(b"POST") else b""
                conn.sendall(
                    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: %d\r\n\r\n%s"
                    % (len(body), body)
                )

    def close(self) -> None:
        self.socket.close()


def outcome(**fields) -> Outcome:
    """A proxied request's outcome with plausible defaults (spec upstream, n-gram), `fields` changed."""
    base = dict(
        request_id="r1",
        started_at=1.8e9,
        model="m",
        prompt_tokens_estimate=7,
        tags={},
        mode_reason="default",
        arm=None,
        load_at_admission=0.25,
        instance="spec1",
        drafter="ngram",
    )
    return Outcome(**{**base, **fields})
