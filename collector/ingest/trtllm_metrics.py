"""TensorRT-LLM's `/prometheus/metrics` (trtllm-serve), as the scraper reads it (collector.ingest.exposition).

TensorRT-LLM (NVIDIA/TensorRT-LLM, `tensorrt_llm/metrics/collector.py`, read at commit
050f80def8df236e326949c8bd9dee10fd896a83) counts, when a request finishes (`log_request_metrics_dict`,
`return_perf_metrics: true`), per draft position (label `token_position`, labels `model_name`, ...):

    trtllm_spec_decode_drafted_tokens_total{token_position}   position 0: drafts; sum: draft tokens
    trtllm_spec_decode_accepted_tokens_total{token_position}  accepted per position (a position is reached
                                                              only past every earlier one: unconditional,
                                                              as vLLM's); sum: accepted tokens
    trtllm_generation_tokens_total                            generated tokens

Its iteration-level `trtllm_spec_decode_num_draft_tokens_total` / `..._num_accepted_tokens_total` count per
engine iteration (`enable_iter_perf_stats`), not per finished request like the generated tokens, and carry no
drafts count: not read. `trtllm_spec_decode_acceptance_length` and `..._draft_overhead` are gauges of the
last iteration: never summed. The per-position series appear once a request drafted, so an exposition
with them is one that speculates.
"""

from __future__ import annotations

from specwatch.collector.ingest.exposition import EngineSchema

DRAFTED_PER_POSITION = "trtllm_spec_decode_drafted_tokens"
TRTLLM = EngineSchema(
    name="TensorRT-LLM",
    prefix="trtllm_",
    counters={"trtllm_generation_tokens": "generation_tokens"},
    per_position="trtllm_spec_decode_accepted_tokens",
    position_label="token_position",
    drafted_per_position=DRAFTED_PER_POSITION,
    histograms={"trtllm_time_to_first_token_seconds": "ttft", "trtllm_e2e_request_latency_seconds": "e2e"},
    rank_label="dp_rank",
    spec_families=frozenset({DRAFTED_PER_POSITION}),
)
