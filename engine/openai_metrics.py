"""A response's per-request `metrics` object, as vLLM 0.32 returns it when started with
`--enable-per-request-metrics --per-request-spec-decode-metrics summary` (its PerRequestMetrics and
SpeculativeDecodingMetrics), built from the engine's RequestRecord, so a gateway reads both alike.

vLLM's timings, mapped onto the record (whose `ttft_s` and `e2e_s` count from arrival, queue included):
- time_to_first_token_ms: scheduling to first token, queue excluded (ttft_s - queue_s);
- generation_time_ms: first token to last (e2e_s - ttft_s);
- queue_time_ms: arrival to scheduling (queue_s);
- mean_itl_ms: generation time / (output tokens - 1), None for fewer than two tokens;
- tokens_per_second: output tokens over scheduling to last token (prefill included).
Each is None where the record lacks what it needs (no first token).
"""

from __future__ import annotations

from specwatch.telemetry import ratios
from specwatch.telemetry.schema import RequestRecord


def vllm_metrics(record: RequestRecord) -> dict:
    """The `metrics` object for the response of the request `record` describes."""
    queue_s, ttft_s, e2e_s, tokens = record.queue_s, record.ttft_s, record.e2e_s, record.output_tokens
    first = None if ttft_s is None else max(ttft_s - queue_s, 0.0)  # scheduling to first token
    generation = None if ttft_s is None else max(e2e_s - ttft_s, 0.0)  # first token to last
    inference = max(e2e_s - queue_s, 0.0)  # scheduling to last token
    return {
        "time_to_first_token_ms": None if first is None else first * 1000,
        "generation_time_ms": None if generation is None else generation * 1000,
        "queue_time_ms": queue_s * 1000,
        "mean_itl_ms": generation / (tokens - 1) * 1000 if generation is not None and tokens > 1 else None,
        "tokens_per_second": tokens / inference if ttft_s is not None and inference > 0 else None,
        "speculative_decoding": speculative_decoding(record),
    }


def speculative_decoding(record: RequestRecord) -> dict | None:
    """vLLM's SpeculativeDecodingMetrics (summary level) for a request that ran in speculative mode with
    gamma > 0, even if it never drafted (vLLM reports it whenever speculation is configured); else None.

    `num_spec_tokens` is the request's gamma, the most any round drafted (the adaptive lookahead and the
    token budget may draft fewer), so every round's accepted count fits the histogram's gamma + 1 bins."""
    if record.mode != "speculative" or record.gamma == 0:
        return None
    steps, drafted, accepted = record.num_drafts, record.num_draft_tokens, record.num_accepted_tokens
    return {
        "mean_acceptance_length": ratios.mean_acceptance_length(accepted, steps) or 1.0,
        "draft_acceptance_rate": ratios.acceptance_rate(accepted, drafted) or 0.0,
        "acceptance_histogram": acceptance_histogram(record.accepted_per_position, steps),
        "num_spec_steps": steps,
        "num_accepted_draft_tokens": accepted,
        "num_draft_tokens": drafted,
        "num_spec_tokens": record.gamma,
    }


def acceptance_histogram(accepted_per_position: list[int], num_drafts: int) -> list[int]:
    """Drafts by how many of their tokens were accepted (index j: exactly j), from the cumulative counts
    (position i: drafts that accepted more than i tokens). Sums to num_drafts; sum(j * h[j]) = accepted."""
    at_least = [num_drafts, *accepted_per_position, 0]
    return [at_least[j] - at_least[j + 1] for j in range(len(accepted_per_position) + 1)]
