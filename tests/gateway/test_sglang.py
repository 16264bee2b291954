"""SGLang's per-request `meta_info` read into the RequestRecord (gateway.sglang), normalised to specwatch's
acceptance definitions, with impossible counts clamped and flagged.

Fixture `fixtures/sglang_generate_whole.json`: a native `/generate` answer shaped as sgl-project/sglang
emits it at commit 001067fffe33427bee0ed2f007fb7551a1d76b44 (keys from
`python/sglang/srt/managers/tokenizer_manager.py`, `_calculate_spec_decoding_metrics`: spec_verify_ct,
spec_num_correct_drafts, spec_num_proposed_drafts = verify_ct * (speculative_num_draft_tokens - 1),
spec_accept_rate = correct / proposed, spec_accept_length = completion_tokens / verify_ct,
spec_correct_drafts_histogram and the aliases spec_accepted_drafts / spec_proposed_drafts /
spec_accept_histogram). SGLang cannot run on these CPUs: the values are ours, made consistent with
those formulas for speculative_num_draft_tokens = 4 (k = 3), 10 verify steps with histogram [2, 3, 1, 4]:
17 accepted of 30 drafted, 28 completion tokens (1 from prefill + 10 steps x (accepted + 1)).
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

from specwatch.collector.ingest.store import Store
from specwatch.collector.reads.queries import Filters, Window, signals
from specwatch.gateway.records import SseReader
from specwatch.gateway.sglang import CLAMPED_TAG, sglang_counts
from specwatch.telemetry.schema import IngestBatch

ANSWER = orjson.loads((Path(__file__).parent / "fixtures" / "sglang_generate_whole.json").read_bytes())


def meta(**changes) -> dict:
    return {**copy.deepcopy(ANSWER["meta_info"]), **changes}


def test_a_generate_answer_becomes_a_record_with_specwatch_acceptance():
    record = outcome(meta_info=meta(), usage=None).record()
    assert (record.prompt_tokens, record.output_tokens) == (19, 28)  # from meta_info: /generate has no usage
    assert record.draft_counts_known
    assert (record.num_drafts, record.num_draft_tokens, record.num_accepted_tokens) == (10, 30, 17)
    assert record.accepted_per_position == [8, 5, 4] and record.gamma == 3
    assert record.acceptance_rate == pytest.approx(17 / 30)  # SGLang's spec_accept_rate: same definition
    assert record.mean_acceptance_length == pytest.approx(2.7)  # 1 + 17/10, not SGLang's 28/10
    assert record.tags["sglang_accept_length"] == "2.8" and record.tags["sglang_accept_rate"] == "0.566667"
    assert CLAMPED_TAG not in record.tags


def test_the_older_key_names_read_the_same():
    older = {k: v for k, v in meta().items() if not k.startswith(("spec_num_", "spec_correct", "spec_accepted"))}
    older |= {"spec_accept_token_num": 17, "spec_draft_token_num": 30}
    del older["spec_proposed_drafts"]
    record = outcome(meta_info=older, usage=None).record()
    assert (record.num_drafts, record.num_draft_tokens, record.num_accepted_tokens) == (10, 30, 17)
    assert record.accepted_per_position == [8, 5, 4]  # from the spec_accept_histogram alias


@pytest.mark.parametrize(
    ("changes", "accepted", "flag"),
    [
        ({"spec_num_correct_drafts": 41, "completion_tokens": 52}, 30, "over_drafted:41"),
        ({"spec_num_correct_drafts": 25, "completion_tokens": 20}, 20, "over_completion:25"),
        ({"spec_num_correct_drafts": 45}, 28, "over_drafted+over_completion:45"),
    ],
)
def test_impossible_counts_are_clamped_and_flagged(changes, accepted, flag):
    record = outcome(meta_info=meta(**changes), usage=None).record()
    assert record.num_accepted_tokens == accepted and record.num_draft_tokens == 30
    assert record.tags[CLAMPED_TAG] == flag
    assert record.accepted_per_position == []  # a histogram that disagrees with the clamped count is dropped


def test_the_clamp_bound_is_usage_when_the_answer_has_it():
    record = outcome(meta_info=meta(spec_num_correct_drafts=25), usage={"completion_tokens": 12}).record()
    assert (record.num_accepted_tokens, record.tags[CLAMPED_TAG]) == (12, "over_completion:25")


def test_a_histogram_that_disagrees_with_the_counts_is_dropped_not_trusted():
    record = outcome(meta_info=meta(spec_correct_drafts_histogram=[0, 0, 0, 10]), usage=None).record()
    assert record.num_accepted_tokens == 17 and record.accepted_per_position == []


def test_a_request_that_never_verified_drafted_nothing():
    record = outcome(meta_info={"completion_tokens": 1, "prompt_tokens": 5, "spec_verify_ct": 0}).record()
    assert record.draft_counts_known and (record.num_drafts, record.num_draft_tokens) == (0, 0)


UNREADABLE = [{"spec_verify_ct": -1}, {"spec_num_proposed_drafts": "30"}, {"spec_verify_ct": 40}]


@pytest.mark.parametrize("changes", UNREADABLE)
def test_unreadable_counts_are_unknown_not_guessed(changes):
    found = meta(**changes)
    if "spec_num_proposed_drafts" in changes:
        del found["spec_proposed_drafts"]
    assert sglang_counts(found, 28).counts is None
    assert not outcome(meta_info=found, usage=None).record().draft_counts_known


def test_a_full_tag_set_keeps_the_client_tags_and_the_record_and_logs_the_clamp(caplog):
    tags = {f"t{i}": "x" for i in range(16)}
    record = outcome(meta_info=meta(spec_num_correct_drafts=41), usage=None, tags=tags).record()
    assert record.tags == tags and record.num_accepted_tokens == 28
    assert "spec_clamped=over_drafted+over_completion:41" in caplog.text


def test_the_sse_reader_keeps_the_last_cumulative_meta_info():
    reader = SseReader(drop_usage_chunk=False)
    first = {"text": " the", "meta_info": meta(completion_tokens=1, spec_verify_ct=0)}
    last = {"text": ANSWER["text"], "meta_info": meta()}
    data = b"".join(b"data: " + orjson.dumps(c) + b"\n\n" for c in (first, last)) + b"data: [DONE]\n\n"
    assert reader.feed(data) == data
    result = outcome(usage=None)
    reader.note(result)
    assert result.status == "ok" and result.meta_info["spec_verify_ct"] == 10
    assert reader.saw_content and reader.content_chunks == 2  # the gateway's TTFT starts at the first


# SGLang's native stream: each chunk's meta_info is cumulative, the last one holds the finished counts
STREAM = (
    b"".join(
        b"data: " + orjson.dumps({"text": ANSWER["text"][:n], "meta_info": meta(completion_tokens=n)}) + b"\n\n"
        for n in (1, 28)
    )
    + b"data: [DONE]\n\n"
)


def sglang_upstream() -> Starlette:
    async def generate(request: Request) -> Response:
        body = orjson.loads(await request.body())
        if "stream_options" in body:  # /generate takes no OpenAI options
            return JSONResponse({"error": "unexpected stream_options"}, status_code=400)
        if body.get("text") == "clamp":  # SGLang's counting bug: more accepted than drafted
            return JSONResponse({**ANSWER, "meta_info": meta(spec_num_correct_drafts=45)})
        if body.get("stream"):
            return StreamingResponse(iter([STREAM]), media_type="text/event-stream")
        return JSONResponse(ANSWER)

    async def ok(request: Request) -> PlainTextResponse:
        return PlainTextResponse("")

    routes = [Route("/generate", generate, methods=["POST"]), Route("/health", ok), Route("/metrics", ok)]
    return Starlette(routes=routes)


def test_a_record_through_the_gateway_lands_in_the_store_with_normalised_acceptance(db):
    with ThreadServer(sglang_upstream()) as upstream, GatewayServer([f"sgl={upstream.url},drafter=ngram"]) as gw:
        answer = httpx.post(f"{gw.url}/generate", json={"text": "the quick", "sampling_params": {}}, timeout=30)
        assert answer.status_code == 200 and answer.json() == ANSWER  # passed on unchanged
        record = gw.wait_records(1)[0]
    assert (record.num_drafts, record.num_draft_tokens, record.num_accepted_tokens) == (10, 30, 17)
    Store(db).insert(IngestBatch.model_validate({"requests": [record.model_dump(mode="json")]}))
    window = Window(record.started_at - 1, record.started_at + 60)
    read = signals(db, window, Filters(instance=record.instance))
    assert read.acceptance_rate == pytest.approx(17 / 30)
    assert read.mean_acceptance_length == pytest.approx(2.7)


def test_a_streamed_generate_is_passed_on_and_recorded():
    with ThreadServer(sglang_upstream()) as upstream, GatewayServer([f"sgl={upstream.url},drafter=ngram"]) as gw:
        answer = httpx.post(f"{gw.url}/generate", json={"text": "the quick", "stream": True}, timeout=30)
        assert answer.status_code == 200 and answer.content == STREAM
        record = gw.wait_records(1)[0]
    assert record.status == "ok" and record.ttft_s is not None
    assert (record.num_drafts, record.num_accepted_tokens, record.output_tokens) == (10, 17, 28)


def test_a_clamped_record_is_counted_on_the_gateways_metrics():
    with ThreadServer(sglang_upstream()) as upstream, GatewayServer([f"sgl={upstream.url},drafter=ngram"]) as gw:
        for text in ("clamp", "fine"):
            assert httpx.post(f"{gw.url}/generate", json={"text": text}, timeout=30).status_code == 200
        records = gw.wait_records(2)
        exposition = httpx.get(f"{gw.url}/metrics", timeout=30).text
    assert [r.tags.get(CLAMPED_TAG) for r in records] == ["over_drafted+over_completion:45", None]
    assert 'specwatch_gateway_clamped_counts_total{upstream="sgl"} 1.0' in exposition
