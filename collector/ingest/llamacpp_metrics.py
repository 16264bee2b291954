"""llama.cpp server's /metrics (`llama-server --metrics`), as the scraper reads it (collector.ingest.exposition).

ggml-org/llama.cpp added speculative counters in vLLM's schema with PR #26389 (merged 2026-08); the stored
upstream `tools/server/server-context.cpp` at fb4026604c67c682f552337ec9b91eced0abd35a predates it (no spec
counters). The format below is the one written by `server_task_result_metrics::to_metrics` in a stored
`tools/server/server-task.cpp` that has them (a downstream build; the index names no commit for it): one
`llamacpp:` prefix, no labels but `position`, no `_created`, numbers printed with C++ stream defaults.

    llamacpp:spec_decode_num_drafts_total                     verify steps            -> drafts
    llamacpp:spec_decode_num_draft_tokens_total               draft tokens            -> draft_tokens
    llamacpp:spec_decode_num_accepted_tokens_total            accepted draft tokens   -> accepted_tokens
    llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position}  (absent until a request drafted)
    llamacpp:tokens_predicted_total                           generated tokens        -> generation_tokens

PR #26389's description names the counters without `_total`: a counter sample named as its family is read
too. The spec counters are exposed whether or not the server drafts, so it counts as speculating once drafts
are above 0. C++ stream defaults keep 6 significant digits (`3.05406e+06`): past a million, a delta between
two scrapes carries that rounding. One server serves one model: rows have an empty model and rank.
"""

from __future__ import annotations

from specwatch.collector.ingest.exposition import EngineSchema

LLAMACPP = EngineSchema(
    name="llama.cpp",
    prefix="llamacpp:",
    counters={
        "llamacpp:spec_decode_num_drafts": "drafts",
        "llamacpp:spec_decode_num_draft_tokens": "draft_tokens",
        "llamacpp:spec_decode_num_accepted_tokens": "accepted_tokens",
        "llamacpp:tokens_predicted": "generation_tokens",
    },
    per_position="llamacpp:spec_decode_num_accepted_tokens_per_pos",
)
