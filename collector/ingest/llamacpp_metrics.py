"""llama.cpp server's /metrics (`llama-server --metrics`), as the scraper reads it (collector.ingest.exposition).

Its exposition (`server_task_result_metrics::to_metrics`, which the `/metrics` route of
ggml-org/llama.cpp `tools/server/server-context.cpp` at commit 001d906a6d86e2490e394361e7cc6f478b100088
renders) carries vLLM's counter schema under the `llamacpp:` prefix, with no labels and no `_created`:

    llamacpp:spec_decode_num_drafts_total                     verify steps            -> drafts
    llamacpp:spec_decode_num_draft_tokens_total               draft tokens            -> draft_tokens
    llamacpp:spec_decode_num_accepted_tokens_total            accepted draft tokens   -> accepted_tokens
    llamacpp:spec_decode_num_accepted_tokens_per_pos_total{position}  (only once a position was reached)
    llamacpp:tokens_predicted_total                           generated tokens        -> generation_tokens

The spec counters are exposed whether or not the server drafts, so it counts as speculating once drafts
are above 0. Values are printed with C++ stream defaults (6 significant digits, `3.05406e+06`): past a
million, a delta between two scrapes carries that rounding. One server serves one model: rows have an
empty model and rank.
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
