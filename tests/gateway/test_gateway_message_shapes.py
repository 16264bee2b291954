"""Issue 57 through the gateway, in front of the bundled engine: the message shapes OpenAI clients send
(content parts, developer role, `max_completion_tokens`, `stream_options.continuous_usage_stats`, `ignore_eos`)
are served as the engine serves them directly, and a refusal is a 400 naming the field, recorded by both."""

from __future__ import annotations

import httpx
import orjson
import pytest
from engine_harness import spec_and_plain
from gateway_harness import GatewayServer
from waiting import wait_for

PARTS = [{"type": "text", "text": "Name a colour."}, {"type": "text", "text": "One word."}]


@pytest.fixture(scope="module")
def servers(bundled_engine):
    """(gateway, spec engine): the gateway routes every request to the speculating engine."""
    with spec_and_plain(bundled_engine) as (spec, _), GatewayServer([f"spec1={spec.url},drafter=ngram"]) as gw:
        yield gw, spec


def chat(url: str, **body) -> httpx.Response:
    body = {"messages": [{"role": "user", "content": PARTS}], "max_tokens": 8, "temperature": 0, **body}
    return httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)


def test_content_parts_and_the_developer_role_are_served_as_directly(servers):
    gw, spec = servers
    messages = [
        {"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
        {"role": "user", "content": PARTS},
    ]
    through, direct = chat(gw.url, messages=messages), chat(spec.url, messages=messages)
    assert through.status_code == direct.status_code == 200, through.text
    assert through.json()["choices"][0]["message"] == direct.json()["choices"][0]["message"]


def test_max_completion_tokens_and_ignore_eos_fix_the_length(servers):
    gw, _ = servers
    answer = chat(gw.url, max_tokens=None, max_completion_tokens=20, ignore_eos=True)
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["completion_tokens"] == 20
    assert gw.wait_records(1) and wait_for(lambda: gw.records[-1].output_tokens == 20, "the gateway's record")


def test_continuous_usage_reaches_the_client_on_every_chunk(servers):
    gw, _ = servers
    options = {"include_usage": True, "continuous_usage_stats": True}
    answer = chat(gw.url, stream=True, stream_options=options, max_tokens=10, ignore_eos=True)
    assert answer.status_code == 200, answer.text
    events = [line[6:] for line in answer.text.splitlines() if line.startswith("data: ")]
    counts = [orjson.loads(event)["usage"]["completion_tokens"] for event in events[:-1]]
    assert events[-1] == "[DONE]" and counts == sorted(counts) and counts[-1] == 10


def test_a_refusal_passes_through_naming_the_field_and_both_record_it(servers):
    gw, spec = servers
    image = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
    before_gw, before_engine = len(gw.records), len(spec.records)
    answer = chat(gw.url, messages=[{"role": "user", "content": [image]}])
    assert answer.status_code == 400 and "image_url" in answer.json()["error"]["message"], answer.text
    gateway = wait_for(lambda: gw.records[before_gw:] and gw.records[-1], "the gateway's record")
    engine = wait_for(lambda: spec.records[before_engine:] and spec.records[-1], "the engine's record")
    assert (gateway.status, gateway.error) == ("error", "upstream:400")
    assert (engine.status, engine.error) == ("error", "refused:unsupported")
    assert engine.request_id == gateway.request_id  # one request: one row at the collector
