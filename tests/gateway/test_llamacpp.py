"""llama.cpp server's per-request `timings` through the gateway (gateway.llamacpp).

Fixtures (tests/gateway/fixtures/llamacpp_chat_whole.json, llamacpp_chat_stream.sse) have the shape
ggml-org/llama.cpp `tools/server/server-task.cpp` at commit 00efb3e184262872916bf136b3df63c1822a19bd writes:
`to_json_oaicompat_chat` puts `timings` (`result_timings::to_json`: draft_n and draft_n_accepted once the
request drafted) after `id`; `to_json_oaicompat_chat_stream` puts it on the last chunk, the usage chunk
when `include_usage`. Values made up.
"""

from __future__ import annotations

import copy
from pathlib import Path

import httpx
import orjson
import pytest
from gateway_harness import GatewayServer, ThreadServer, outcome
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route

from specwatch.gateway.records import SseReader
from specwatch.telemetry.clamps import CLAMPED_TAG

FIXTURES = Path(__file__).parent / "fixtures"
ANSWER = orjson.loads((FIXTURES / "llamacpp_chat_whole.json").read_bytes())
STREAM = (FIXTURES / "llamacpp_chat_stream.sse").read_bytes()


def timings(**changes) -> dict:
    return {**copy.deepcopy(ANSWER["timings"]), **changes}


def test_timings_become_tags_and_leave_draft_counts_unknown():
    record = outcome(usage=ANSWER["usage"], timings=timings()).record()
    assert not record.draft_counts_known  # no verify-step count: acceptance comes from /metrics
    assert (record.num_drafts, record.num_draft_tokens, record.num_accepted_tokens) == (0, 0, 0)
    assert (record.tags["llamacpp_draft_n"], record.tags["llamacpp_draft_n_accepted"]) == ("40", "15")
    assert (record.output_tokens, record.prompt_tokens) == (24, 31) and CLAMPED_TAG not in record.tags


@pytest.mark.parametrize(
    ("changes", "accepted", "flag"),
    [
        ({"draft_n_accepted": 45}, "24", "over_drafted+over_completion:45"),
        ({"draft_n_accepted": 30}, "24", "over_completion:30"),  # 24 completion tokens
        ({"draft_n_accepted": -3}, "0", "negative:-3"),
        ({"draft_n": -1, "draft_n_accepted": 2}, "0", "negative_drafted+over_drafted:2"),
    ],
)
def test_impossible_timings_are_clamped_and_flagged(changes, accepted, flag):
    record = outcome(usage=ANSWER["usage"], timings=timings(**changes)).record()
    assert record.tags["llamacpp_draft_n_accepted"] == accepted and record.tags[CLAMPED_TAG] == flag


def test_vllm_counts_win_over_timings():
    spec = {"acceptance_histogram": [1, 2, 3], "num_draft_tokens": 12}
    record = outcome(usage=ANSWER["usage"], metrics={"speculative_decoding": spec}, timings=timings()).record()
    assert record.draft_counts_known and record.num_drafts == 6 and "llamacpp_draft_n" not in record.tags


def test_the_sse_reader_keeps_timings_from_a_dropped_usage_chunk():
    reader = SseReader(drop_usage_chunk=True)
    passed = reader.feed(STREAM)
    assert b'"usage"' not in passed and passed.endswith(b"data: [DONE]\n\n")  # the client did not ask for it
    assert reader.timings["draft_n"] == 40 and reader.usage["completion_tokens"] == 24


def llamacpp_upstream() -> Starlette:
    async def chat(request: Request) -> Response:
        body = orjson.loads(await request.body())
        if body.get("stream"):
            assert body["stream_options"] == {"include_usage": True}  # the gateway asked on the client's behalf
            return StreamingResponse(iter([STREAM]), media_type="text/event-stream")
        if body.get("max_tokens") == 999:  # a counting bug: more accepted than drafted
            return JSONResponse({**ANSWER, "timings": timings(draft_n_accepted=41)})
        return JSONResponse(ANSWER)

    async def ok(request: Request) -> PlainTextResponse:
        return PlainTextResponse("")

    routes = [Route("/v1/chat/completions", chat, methods=["POST"]), Route("/health", ok), Route("/metrics", ok)]
    return Starlette(routes=routes)


def ask(url: str, **body) -> httpx.Response:
    messages = [{"role": "user", "content": "the quick"}]
    return httpx.post(f"{url}/v1/chat/completions", json={"model": "m", "messages": messages, **body}, timeout=30)


def test_whole_and_streamed_answers_through_the_gateway():
    with ThreadServer(llamacpp_upstream()) as upstream, GatewayServer([f"llama={upstream.url},drafter=ngram"]) as gw:
        assert ask(gw.url).json() == ANSWER  # passed on unchanged
        events = STREAM.split(b"\n\n")
        without_usage = b"\n\n".join(e for e in events if b'"usage"' not in e)  # the client did not ask for it
        assert ask(gw.url, stream=True).content == without_usage
        assert ask(gw.url, max_tokens=999).status_code == 200
        records = gw.wait_records(3)
    for record in records:
        assert not record.draft_counts_known and record.status == "ok" and record.output_tokens == 24
        assert record.tags["llamacpp_draft_n"] == "40"
    assert sorted(r.tags.get(CLAMPED_TAG, "") for r in records) == ["", "", "over_drafted+over_completion:41"]
