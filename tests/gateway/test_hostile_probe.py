"""Issue 30's probe, request half: hostile request bodies sent to the engine and to a gateway in front
of it. Every one is a 4xx in OpenAI's error shape (never a 5xx), reaches no upstream from the gateway,
and leaves no record behind (the ingest half: tests/collector/test_ingest_hostile.py)."""

from __future__ import annotations

import httpx
import orjson
import pytest
from engine_harness import BackgroundServer
from gateway_harness import GatewayServer

from specwatch.engine.policy import PolicyConfig
from specwatch.engine.scheduler import SchedulerConfig

JSON = {"content-type": "application/json"}
OK = {"prompt": "Hi", "max_tokens": 2}
OK_CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


def deep(depth: int) -> bytes:
    return b"[" * depth + b"]" * depth


# (path, raw body): refused by both servers (the gateway checks what it reads, the engine the rest)
BOTH = {
    "not JSON": ("completions", b"{"),
    "empty body": ("completions", b""),
    "a JSON list": ("completions", b"[]"),
    "a JSON string": ("completions", b'"hi"'),
    "JSON null": ("completions", b"null"),
    "invalid UTF-8": ("completions", b'{"prompt": "\xff"}'),
    "NaN literal": ("completions", b'{"prompt": "Hi", "temperature": NaN}'),
    "nested 2000 deep": ("completions", b'{"prompt": ' + deep(2000) + b"}"),
    "stream as string": ("completions", orjson.dumps({**OK, "stream": "yes"})),
    "stream_options not an object": ("completions", orjson.dumps({**OK, "stream": True, "stream_options": 1})),
    "tags not an object": ("completions", orjson.dumps({**OK, "tags": [1]})),
    "tag value too long": ("completions", orjson.dumps({**OK, "tags": {"a": "x" * 1000}})),
    "tag with NUL": ("completions", orjson.dumps({**OK, "tags": {"a": "\u0000"}})),
    "too many tags": ("completions", orjson.dumps({**OK, "tags": {f"k{i}": "v" for i in range(17)}})),
    "chat: invalid JSON": ("chat/completions", b'{"messages": ['),
    "chat: stream as 1": ("chat/completions", orjson.dumps({**OK_CHAT, "stream": 1})),
}
# refused by the engine (a gateway passes these on to its upstream, whose 400 reaches the client)
ENGINE = {
    "count as string": ("completions", orjson.dumps({**OK, "max_tokens": "20"})),
    "count as true": ("completions", orjson.dumps({**OK, "max_tokens": True})),
    "count as float": ("completions", orjson.dumps({**OK, "max_tokens": 2.5})),
    "huge max_tokens": ("completions", orjson.dumps({**OK, "max_tokens": 10**9})),
    "seed past 64 bits": ("completions", b'{"prompt": "Hi", "seed": 100000000000000000000000}'),
    "negative temperature": ("completions", orjson.dumps({**OK, "temperature": -1})),
    "temperature as string": ("completions", orjson.dumps({**OK, "temperature": "hot"})),
    "top_p 0": ("completions", orjson.dumps({**OK, "top_p": 0})),
    "n 2": ("completions", orjson.dumps({**OK, "n": 2})),
    "logprobs": ("completions", orjson.dumps({**OK, "logprobs": 3})),
    "prompt as number": ("completions", orjson.dumps({"prompt": 5})),
    "prompt as token ids": ("completions", orjson.dumps({"prompt": [1, 2, 3]})),
    "two prompts": ("completions", orjson.dumps({"prompt": ["a", "b"]})),
    "no prompt": ("completions", orjson.dumps({"max_tokens": 2})),
    "five stops": ("completions", orjson.dumps({**OK, "stop": ["a", "b", "c", "d", "e"]})),
    "a model path as drafter": ("completions", orjson.dumps({**OK, "drafter": "model:/etc/passwd"})),
    "huge drafter": ("completions", orjson.dumps({**OK, "drafter": "x" * 100_000})),
    "gamma 65": ("completions", orjson.dumps({**OK, "gamma": 65})),
    "another model": ("completions", orjson.dumps({**OK, "model": "gpt-9"})),
    "chat: no messages": ("chat/completions", orjson.dumps({"messages": []})),
    "chat: unknown role": ("chat/completions", orjson.dumps({"messages": [{"role": "root", "content": "x"}]})),
    "chat: content a number": ("chat/completions", orjson.dumps({"messages": [{"role": "user", "content": 1}]})),
    "chat: messages a string": ("chat/completions", orjson.dumps({"messages": "hi"})),
    "chat: logprobs": ("chat/completions", orjson.dumps({**OK_CHAT, "logprobs": True, "top_logprobs": 2})),
}


@pytest.fixture(scope="module")
def engine_server(bundled_engine):
    with BackgroundServer(bundled_engine, SchedulerConfig(slots=2, max_queue=8), PolicyConfig()) as server:
        yield server


def probe(url: str, cases: dict) -> dict[str, int]:
    """Each case's status, after checking it is an OpenAI-shaped 4xx."""
    statuses = {}
    with httpx.Client(timeout=60) as client:
        for name, (path, body) in cases.items():
            response = client.post(f"{url}/v1/{path}", content=body, headers=JSON)
            statuses[name] = response.status_code
            assert 400 <= response.status_code < 500, (name, response.status_code, response.text[:300])
            assert response.json()["error"]["message"], name
    return statuses


def _refusals_only(records) -> bool:
    """Issue 57: a refused request leaves a trace, a whole record of the refusal (status error, error
    `refused:<reason>`, nothing generated), never a part of the hostile body's request."""
    return all(r.status == "error" and r.error.startswith("refused:") and r.output_tokens == 0 for r in records)


def test_hostile_bodies_are_4xx_at_the_engine_and_leave_only_a_refusal_record(engine_server):
    before = len(engine_server.records)
    probe(engine_server.url, BOTH | ENGINE)
    assert _refusals_only(engine_server.records[before:])
    served = httpx.post(f"{engine_server.url}/v1/completions", json=OK, timeout=60)
    assert served.status_code == 200  # still serving


def test_hostile_bodies_are_4xx_at_the_gateway_and_reach_no_upstream(engine_server):
    with GatewayServer([f"e={engine_server.url}"]) as gateway:
        before = len(engine_server.records)
        probe(gateway.url, BOTH)
        assert gateway.records == [] and len(engine_server.records) == before
        passed_on = probe(gateway.url, ENGINE)  # the engine's refusal reaches the client unchanged
        assert set(passed_on.values()) <= {400, 404}
        assert _refusals_only(engine_server.records[before:])
        assert {r.status for r in gateway.wait_records(len(ENGINE))} == {"error"}
