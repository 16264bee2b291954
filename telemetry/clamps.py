"""Impossible engine counts, clamped and flagged: one rule for every adapter (gateway.sglang, gateway's
llama.cpp timings, collector.ingest.trtllm_perf).

Engines have counting bugs (SGLang has reported more accepted tokens than it drafted or generated). Such a
count is clamped to what is possible and the record tagged `spec_clamped=<bounds broken>:<reported value>`,
so it is never stored as if it were sound, and the gateway's /metrics counts it.
"""

from __future__ import annotations

CLAMPED_TAG = "spec_clamped"  # which bounds an impossible engine count broke, and the value it reported


def clamp_accepted(accepted: int, drafted: int, completion_tokens: int | None) -> tuple[int, str | None]:
    """`accepted` within 0..min(drafted, completion tokens), and the bounds it broke joined by `+`
    (None: it broke none)."""
    broke = []
    if accepted < 0:
        broke.append("negative")
    if accepted > drafted:
        broke.append("over_drafted")
    if completion_tokens is not None and accepted > completion_tokens:
        broke.append("over_completion")
    bound = drafted if completion_tokens is None else min(drafted, completion_tokens)
    return (max(0, min(accepted, bound)), "+".join(broke)) if broke else (accepted, None)


def clamped_tag(reason: str, reported: int | float) -> dict[str, str]:
    return {CLAMPED_TAG: f"{reason}:{reported}"}
