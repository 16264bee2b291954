"""vLLM 0.32's per-request `metrics` object: the pure mapping from a RequestRecord, then the bundled
engine's responses (whole and streamed) against the record it emitted for the same request."""

from __future__ import annotations

import httpx
import orjson
import pytest
from engine_harness import BackgroundServer

from specwatch.engine.openai_metrics import acceptance_histogram, vllm_metrics
from specwatch.engine.scheduler import SchedulerConfig
from specwatch.telemetry.schema import RequestRecord

KEYS = {
    "time_to_first_token_ms",
    "generation_time_ms",
    "queue_time_ms",
    "mean_itl_ms",
    "tokens_per_second",
    "speculative_decoding",
}
SPEC_KEYS = {
    "mean_acceptance_length",
    "draft_acceptance_rate",
    "acceptance_histogram",
    "num_spec_steps",
    "num_accepted_draft_tokens",
    "num_draft_tokens",
    "num_spec_tokens",
}


def record(**fields) -> RequestRecord:
    base = dict(request_id="r", instance="i", model="m", started_at=1.7e9, e2e_s=1.0, prompt_tokens=5)
    return RequestRecord(**{**base, "output_tokens": 9, "mode": "speculative", "drafter": "ngram", **fields})


def check_histogram(spec: dict, rec: RequestRecord) -> None:
    """vLLM's identities: one bin per accepted count 0..gamma, steps and accepted tokens recovered."""
    hist = spec["acceptance_histogram"]
    assert len(hist) == rec.gamma + 1 and min(hist) >= 0
    assert sum(hist) == spec["num_spec_steps"] == rec.num_drafts
    assert sum(j * n for j, n in enumerate(hist)) == spec["num_accepted_draft_tokens"] == rec.num_accepted_tokens
    assert spec["num_draft_tokens"] == rec.num_draft_tokens and spec["num_spec_tokens"] == rec.gamma


@pytest.mark.parametrize(
    ("gamma", "drafts", "drafted", "per_position", "histogram"),
    [
        (4, 0, 0, [0, 0, 0, 0], [0, 0, 0, 0, 0]),  # speculative, never drafted
        (3, 2, 6, [2, 2, 2], [0, 0, 0, 2]),  # every draft fully accepted
        (3, 4, 12, [0, 0, 0], [4, 0, 0, 0]),  # none accepted
        # mixed, rounds shorter than gamma (adaptive lookahead): 1 draft took 0, 2 took 1, 1 took 2, 1 took 4
        (4, 5, 11, [4, 2, 1, 1], [1, 2, 1, 0, 1]),
    ],
)
def test_histogram_from_cumulative_counts(gamma, drafts, drafted, per_position, histogram):
    fields = dict(gamma=gamma, num_drafts=drafts, num_draft_tokens=drafted, accepted_per_position=per_position)
    fields["num_accepted_tokens"] = sum(per_position)
    rec = record(**fields)
    spec = vllm_metrics(rec)["speculative_decoding"]
    assert set(spec) == SPEC_KEYS and spec["acceptance_histogram"] == histogram
    check_histogram(spec, rec)
    steps, accepted = rec.num_drafts, rec.num_accepted_tokens
    assert spec["mean_acceptance_length"] == (1.0 + accepted / steps if steps else 1.0)
    assert spec["draft_acceptance_rate"] == (accepted / rec.num_draft_tokens if rec.num_draft_tokens else 0.0)


def test_histogram_of_a_single_position():
    assert acceptance_histogram([3], num_drafts=5) == [2, 3]
    assert acceptance_histogram([], num_drafts=0) == [0]


def test_timings_exclude_the_queue_as_vllm_does():
    rec = record(queue_s=0.5, ttft_s=0.75, e2e_s=2.75, output_tokens=10, gamma=0, mode="autoregressive", drafter=None)
    metrics = vllm_metrics(rec)
    assert metrics == {
        "time_to_first_token_ms": 250.0,
        "generation_time_ms": 2000.0,
        "queue_time_ms": 500.0,
        "mean_itl_ms": pytest.approx(2000.0 / 9),
        "tokens_per_second": pytest.approx(10 / 2.25),
        "speculative_decoding": None,
    }


def test_unknown_timings_are_none():
    metrics = vllm_metrics(record(ttft_s=None, output_tokens=0, status="error", gamma=0, mode="autoregressive"))
    assert metrics["time_to_first_token_ms"] is None and metrics["generation_time_ms"] is None
    assert metrics["mean_itl_ms"] is None and metrics["tokens_per_second"] is None
    assert metrics["queue_time_ms"] == 0.0
    one_token = vllm_metrics(record(ttft_s=0.1, e2e_s=0.1, output_tokens=1, gamma=0, mode="autoregressive"))
    assert one_token["mean_itl_ms"] is None and one_token["generation_time_ms"] == 0.0


@pytest.fixture(scope="module")
def server(bundled_engine):
    with BackgroundServer(bundled_engine, SchedulerConfig(slots=1, max_queue=4)) as running:
        yield running


PROMPT = "Repeat: alpha beta gamma alpha beta gamma alpha beta gamma alpha beta gamma alpha"


def matches_record(metrics: dict, rec: RequestRecord) -> None:
    """The response's numbers are the engine's telemetry record for that request, in vLLM's meaning."""
    assert set(metrics) == KEYS
    assert metrics["queue_time_ms"] == pytest.approx(rec.queue_s * 1000)
    assert metrics["time_to_first_token_ms"] == pytest.approx((rec.ttft_s - rec.queue_s) * 1000)
    assert metrics["generation_time_ms"] == pytest.approx((rec.e2e_s - rec.ttft_s) * 1000)
    assert metrics["mean_itl_ms"] == pytest.approx(metrics["generation_time_ms"] / (rec.output_tokens - 1))
    assert metrics["tokens_per_second"] == pytest.approx(rec.output_tokens / (rec.e2e_s - rec.queue_s))


def post(server, path: str, body: dict) -> httpx.Response:
    reply = httpx.post(f"{server.url}{path}", json=body, timeout=60)
    assert reply.status_code == 200, reply.text
    return reply


def test_whole_response_carries_the_records_metrics(server):
    body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "drafter": "ngram", "gamma": 4}
    reply = post(server, "/v1/completions", body).json()
    rec = server.records[-1]
    assert rec.mode == "speculative" and rec.num_drafts > 0 and rec.num_accepted_tokens > 0  # the prompt repeats
    assert reply["usage"]["completion_tokens"] == rec.output_tokens
    matches_record(reply["metrics"], rec)
    spec = reply["metrics"]["speculative_decoding"]
    check_histogram(spec, rec)
    assert spec["mean_acceptance_length"] == pytest.approx(rec.mean_acceptance_length)
    assert spec["draft_acceptance_rate"] == pytest.approx(rec.acceptance_rate)


def test_stream_carries_the_metrics_on_its_final_usage_chunk(server):
    body = {"prompt": PROMPT, "max_tokens": 12, "temperature": 0, "drafter": "ngram", "gamma": 4, "stream": True}
    lines = post(server, "/v1/completions", body).text.split("\n\n")
    chunks = [orjson.loads(line.removeprefix("data: ")) for line in lines if line and line != "data: [DONE]"]
    rec = server.records[-1]
    assert [("metrics" in c, "usage" in c) for c in chunks] == [(False, False)] * (len(chunks) - 1) + [(True, True)]
    assert rec.num_drafts > 0
    matches_record(chunks[-1]["metrics"], rec)
    check_histogram(chunks[-1]["metrics"]["speculative_decoding"], rec)


def test_plain_chat_request_has_no_speculative_decoding(server):
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4, "temperature": 0, "drafter": "none"}
    reply = post(server, "/v1/chat/completions", body).json()
    rec = server.records[-1]
    assert rec.mode == "autoregressive" and reply["metrics"]["speculative_decoding"] is None
    assert set(reply) == {"id", "object", "created", "model", "choices", "usage", "metrics"}
    if rec.output_tokens > 1:
        matches_record(reply["metrics"], rec)


def test_health_answers_in_vllms_spelling(server):
    for path in ("/health", "/healthz"):
        reply = httpx.get(f"{server.url}{path}")
        assert reply.status_code == 200 and reply.json() == {"status": "ok"}
