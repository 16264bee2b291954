"""llama.cpp server's per-request draft counts (`timings`), kept as the engine's own figures.

llama.cpp (ggml-org/llama.cpp `tools/server/server-task.cpp`, `result_timings::to_json`, read at commit
00efb3e184262872916bf136b3df63c1822a19bd) adds to a response's `timings`, once the request drafted:

    draft_n            draft tokens proposed     (RequestRecord num_draft_tokens)
    draft_n_accepted   of them, accepted         (RequestRecord num_accepted_tokens)

and streams `timings` on the last chunk (the usage chunk when `include_usage`). It gives no count of verify
steps (drafts), which the record's mean acceptance length and the drafted-step fraction need, and a
record that claimed 0 drafts would read as "drafting stopped". So the record keeps draft counts unknown
(`draft_counts_known = False`: acceptance queries skip it) and carries llama.cpp's figures as the tags
`llamacpp_draft_n` / `llamacpp_draft_n_accepted`; the instance's normalised acceptance comes from its
/metrics counters (collector.ingest.llamacpp_metrics), which count drafts. Impossible counts (negative,
accepted above drafted or above the completion tokens) are clamped in the tag and flagged `spec_clamped`.
"""

from __future__ import annotations

from typing import Any

from specwatch.telemetry.clamps import clamp_accepted, clamped_tag


def has_draft_timings(timings: Any) -> bool:
    return isinstance(timings, dict) and "draft_n" in timings


def llamacpp_tags(timings: dict, completion_tokens: int | None) -> dict[str, str]:
    """llama.cpp's draft counts as tags (clamped and flagged when impossible); {} when unreadable."""
    drafted, accepted = timings.get("draft_n"), timings.get("draft_n_accepted", 0)
    if type(drafted) is not int or type(accepted) is not int:
        return {}
    broke = ["negative_drafted"] if drafted < 0 else []
    drafted = max(0, drafted)
    kept, reason = clamp_accepted(accepted, drafted, completion_tokens)
    broke += [reason] if reason else []
    tags = clamped_tag("+".join(broke), accepted) if broke else {}
    return {**tags, "llamacpp_draft_n": str(drafted), "llamacpp_draft_n_accepted": str(kept)}
