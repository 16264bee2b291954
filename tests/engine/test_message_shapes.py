"""Issue 57: every message shape OpenAI's API and SDK send for a text model is served (content as a string or
text parts, `name`, system and developer roles, `max_completion_tokens`, `stream_options`); vLLM's `ignore_eos`
and `min_tokens` change the decoding for real; what is not served is a 400 naming the field; and every refusal
leaves a record (status error, `refused:<reason>`) and a count by reason on /metrics."""

from __future__ import annotations

import httpx
import orjson
import pytest
from engine_harness import BackgroundServer
from waiting import wait_for

from specwatch.engine.policy import PolicyConfig
from specwatch.engine.scheduler import SchedulerConfig

GREEDY = {"temperature": 0.0}
# a question SmolLM2 answers in a few tokens, then its end-of-turn token
SHORT = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]


@pytest.fixture(scope="module")
def server(bundled_engine):
    with BackgroundServer(bundled_engine, SchedulerConfig(slots=2, max_queue=8), PolicyConfig()) as running:
        yield running


def chat(server, **body) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/chat/completions", json={"max_tokens": 8, **GREEDY, **body}, timeout=120)


def served(response: httpx.Response) -> dict:
    assert response.status_code == 200, response.text
    return response.json()


def text(response: httpx.Response) -> str:
    return served(response)["choices"][0]["message"]["content"]


def test_content_as_text_parts_is_the_joined_text(server):
    """GuideLLM's shape (issue 57 #1): parts joined by newlines, as vLLM renders them for a text model."""
    parts = [{"type": "text", "text": "Name a colour."}, {"type": "text", "text": "One word."}]
    as_parts = text(chat(server, messages=[{"role": "user", "content": parts}]))
    as_string = text(chat(server, messages=[{"role": "user", "content": "Name a colour.\nOne word."}]))
    assert as_parts == as_string and as_parts


def test_developer_is_the_system_role_and_name_is_accepted(server):
    def asked(role: str, **extra) -> str:
        messages = [{"role": role, "content": "You only answer in French.", **extra}, *SHORT]
        return text(chat(server, messages=messages))

    assert asked("developer") == asked("system")
    assert asked("system", name="setup") and text(chat(server, messages=[{**SHORT[0], "name": "ana"}]))


def test_the_response_id_carries_the_records_request_id(server):
    """As vLLM's (`chatcmpl-<request_id>`): a client's log (GuideLLM's `response_id`) joins the stored rows."""
    for path, prefix, body in [
        ("chat/completions", "chatcmpl-", {"messages": SHORT}),
        ("completions", "cmpl-", {"prompt": "Hi"}),
    ]:
        given = httpx.post(
            f"{server.url}/v1/{path}",
            json={"max_tokens": 2, **body},
            headers={"x-request-id": f"client-{prefix}7"},
            timeout=120,
        )
        assert served(given)["id"] == f"{prefix}client-{prefix}7"
        streamed = httpx.post(f"{server.url}/v1/{path}", json={"max_tokens": 2, "stream": True, **body})
        ids = {orjson.loads(line[6:])["id"] for line in streamed.text.splitlines() if line.startswith("data: {")}
        record = wait_for(lambda: server.records and server.records[-1], "the record")
        assert ids == {f"{prefix}{record.request_id}"}


def test_max_completion_tokens_bounds_the_answer(server):
    usage = served(chat(server, messages=SHORT, max_completion_tokens=3, ignore_eos=True, max_tokens=None))["usage"]
    assert usage["completion_tokens"] == 3


def test_ignore_eos_runs_to_max_tokens(server):
    plain = served(chat(server, messages=SHORT, max_tokens=48))
    assert plain["choices"][0]["finish_reason"] == "stop" and plain["usage"]["completion_tokens"] < 48
    ignoring = served(chat(server, messages=SHORT, max_tokens=48, ignore_eos=True))
    assert ignoring["choices"][0]["finish_reason"] == "length" and ignoring["usage"]["completion_tokens"] == 48


@pytest.mark.parametrize("drafter", ["none", "ngram"])
def test_min_tokens_holds_the_stop_token_back(server, drafter):
    plain = served(chat(server, messages=SHORT, max_tokens=48, drafter=drafter))["usage"]["completion_tokens"]
    held = served(chat(server, messages=SHORT, max_tokens=48, min_tokens=plain + 6, drafter=drafter))
    assert held["usage"]["completion_tokens"] >= plain + 6


def test_min_tokens_keeps_speculation_exact(server):
    """The stop token is masked in the target's rows before verification: greedy speculative output equals
    greedy plain output under the same min_tokens."""
    answers = {
        drafter: text(chat(server, messages=SHORT, max_tokens=24, min_tokens=20, drafter=drafter))
        for drafter in ("none", "ngram", "suffix")
    }
    assert len(set(answers.values())) == 1, answers


def chunks(response: httpx.Response) -> list[dict]:
    assert response.status_code == 200, response.text
    events = [line[6:] for line in response.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [orjson.loads(event) for event in events[:-1]]


def stream(server, **options) -> httpx.Response:
    body = {"messages": SHORT, "max_tokens": 12, "ignore_eos": True, "stream": True, **GREEDY, **options}
    return httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=120)


def test_continuous_usage_stats_put_the_usage_so_far_on_every_chunk(server):
    events = chunks(stream(server, stream_options={"include_usage": True, "continuous_usage_stats": True}))
    counts = [event["usage"]["completion_tokens"] for event in events]
    assert len(events) > 2 and counts == sorted(counts) and counts[-1] == 12 and counts[0] >= 1


def test_without_continuous_usage_only_the_final_chunk_has_usage(server):
    events = chunks(stream(server, stream_options={"include_usage": True}))
    assert [("usage" in event) for event in events] == [False] * (len(events) - 1) + [True]


def refused(response: httpx.Response, param: str) -> dict:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["param"] == param and param in error["message"], error
    return error


IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
AUDIO = {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}
TOOL = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


@pytest.mark.parametrize(
    "body,param,named",
    [
        ({"messages": [{"role": "user", "content": [{"type": "text", "text": "hi"}, IMAGE]}]}, "messages", "image_url"),
        ({"messages": [{"role": "user", "content": [AUDIO]}]}, "messages", "input_audio"),
        ({"messages": [{"role": "user", "content": [{"type": "text"}]}]}, "messages", "messages.0.content"),
        ({"tools": [TOOL]}, "tools", "tools"),
        ({"tool_choice": "auto"}, "tool_choice", "tool_choice"),
        ({"audio": {"voice": "alloy", "format": "wav"}}, "audio", "audio"),
        ({"modalities": ["text", "audio"]}, "modalities", "modalities"),
        ({"response_format": {"type": "json_object"}}, "response_format", "response_format"),
        ({"presence_penalty": 0.5}, "presence_penalty", "presence_penalty"),
        ({"logit_bias": {"42": 5}}, "logit_bias", "logit_bias"),
        ({"messages": [{"role": "assistant", "content": "x", "tool_calls": [{"id": "1"}]}]}, "messages", "tool_calls"),
        ({"stream_options": {"include_usage": True}}, "stream_options", "stream is true"),
        ({"stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options", "include_usage"),
        ({"stream": True, "stream_options": {"usage": True}}, "stream_options", "stream_options.usage"),
        ({"min_tokens": 9}, "min_tokens", "min_tokens"),
        ({"min_tokens": -1}, "min_tokens", "min_tokens"),
        ({"ignore_eos": "yes"}, "ignore_eos", "ignore_eos"),
    ],
)
def test_what_is_not_served_is_a_400_naming_the_field(server, body, param, named):
    error = refused(chat(server, **{"messages": SHORT, **body}), param)
    assert named in error["message"], error


def test_the_served_defaults_of_unserved_fields_pass(server):
    body = {"tools": [], "tool_choice": "none", "presence_penalty": 0, "response_format": {"type": "text"}}
    assert text(chat(server, messages=SHORT, logprobs=False, modalities=["text"], **body)) is not None


def refused_total(server, reason: str) -> float:
    metrics = httpx.get(f"{server.url}/metrics").text
    line = f'specwatch_engine_requests_refused_total{{reason="{reason}"}} '
    return float(next(row for row in metrics.splitlines() if row.startswith(line)).split()[-1])


@pytest.mark.parametrize(
    "path,body,status,reason",
    [
        ("chat/completions", {"messages": [{"role": "user", "content": [IMAGE]}]}, 400, "unsupported"),
        ("chat/completions", {"messages": SHORT, "tools": [TOOL]}, 400, "unsupported"),
        ("completions", {"prompt": "Hi", "max_tokens": 0}, 400, "invalid"),
        ("completions", {"prompt": "Hi " * 20_000}, 400, "context_length"),
        ("completions", {"prompt": "Hi", "model": "gpt-4"}, 404, "model_not_found"),
    ],
)
def test_every_refusal_leaves_a_record_and_a_count(server, path, body, status, reason):
    """Issue 57 #2: a request refused straight at the engine was invisible (no record, no counter)."""
    before, counted = len(server.records), refused_total(server, reason)
    headers = {"x-request-id": f"refused-{reason}-{len(server.records)}"}
    response = httpx.post(f"{server.url}/v1/{path}", json=body, headers=headers, timeout=60)
    assert response.status_code == status, response.text
    record = wait_for(lambda: server.records[before:] and server.records[-1], "the refusal's record")
    assert (record.request_id, record.status, record.error) == (headers["x-request-id"], "error", f"refused:{reason}")
    assert record.output_tokens == 0 and record.drafter is None
    assert refused_total(server, reason) == counted + 1


@pytest.mark.parametrize("field,value", [("echo", True), ("suffix", "!"), ("best_of", 2), ("frequency_penalty", 1.0)])
def test_unserved_completion_fields_are_a_400_naming_them(server, field, value):
    body = {"prompt": "Hi", "max_tokens": 2, field: value}
    refused(httpx.post(f"{server.url}/v1/completions", json=body, timeout=60), field)
