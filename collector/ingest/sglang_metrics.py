"""SGLang's /metrics, as the scraper reads it (collector.ingest.exposition).

SGLang (sgl-project/sglang, `python/sglang/srt/observability/metrics_collector.py`, read at commit
016d8605e45876180312e29d6988e1de06562472) counts, when a request finishes (`observe_one_finished_request`):

    sglang:spec_verify_calls_total    verify steps of the request (its spec_verify_ct)  -> drafts
    sglang:generation_tokens_total    its completion tokens (label is_streaming)        -> generation_tokens
    sglang:num_requests_total         one per request (label is_streaming)

It has no drafted- or accepted-token counter. A request's first token comes from prefill and each verify
step emits its accepted draft tokens plus one, so over an interval
`accepted = generated - verify calls - requests` (SGLang's own accept length is generated / verify calls,
the prefill token included). Draft tokens stay 0 (unknown), so acceptance rate is None for SGLang scrapes
while mean acceptance length and the drafted-step fraction are exact. Its `sglang:spec_accept_length` and
`sglang:spec_accept_rate` are gauges of the last logged batch (an interval snapshot): never summed, not read.
Older releases (the `python/sglang/srt/metrics/collector.py` era) have no verify counter: their scrapes show
no drafts, and the speculation signal cannot tell speculation from none there.
"""

from __future__ import annotations

import logging

from specwatch.collector.ingest.exposition import EngineSchema

log = logging.getLogger("specwatch.collector")


def derive(deltas: dict[str, float]) -> dict[str, float]:
    """Accepted draft tokens from generated tokens, verify calls and finished requests; a negative result
    (a counter that moved without the others, an abort) is clamped to 0 and logged, never stored as sound."""
    drafts, generated = deltas.get("drafts", 0.0), deltas.get("generation_tokens", 0.0)
    accepted = generated - drafts - deltas.get("requests", 0.0) if drafts else 0.0
    if accepted < 0:
        log.warning(
            "SGLang scrape: generated tokens (%g) below verify calls + requests: accepted clamped to 0", generated
        )
    return {"drafts": drafts, "generation_tokens": generated, "accepted_tokens": max(0.0, accepted)}


SGLANG = EngineSchema(
    name="SGLang",
    prefix="sglang:",
    counters={
        "sglang:spec_verify_calls": "drafts",
        "sglang:generation_tokens": "generation_tokens",
        "sglang:num_requests": "requests",
    },
    histograms={"sglang:time_to_first_token_seconds": "ttft", "sglang:e2e_request_latency_seconds": "e2e"},
    rank_label="dp_rank",
    derive=derive,
)
