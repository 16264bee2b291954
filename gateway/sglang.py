"""SGLang's per-request speculative counts (`meta_info`), normalised to the RequestRecord's fields.

SGLang (sgl-project/sglang, `python/sglang/srt/managers/tokenizer_manager.py`,
`_calculate_spec_decoding_metrics`, read at commit 001067fffe33427bee0ed2f007fb7551a1d76b44) puts in a
finished request's `meta_info`, once it verified at least once:

    spec_verify_ct                 verify steps (target forwards while drafting)   -> num_drafts
    spec_num_proposed_drafts       verify_ct * (speculative_num_draft_tokens - 1)  -> num_draft_tokens
    spec_num_correct_drafts        draft tokens the target accepted                -> num_accepted_tokens
    spec_correct_drafts_histogram  steps by the number of draft tokens they accepted (vLLM's histogram)
    spec_accept_rate               correct / proposed: specwatch's acceptance rate
    spec_accept_length             completion_tokens / verify_ct: NOT 1 + accepted / drafts (it counts the
                                   prefill token and tokens made without drafting), so it is kept as a tag

Earlier releases name the counts `spec_accept_token_num` / `spec_draft_token_num` and the histogram
`spec_accept_histogram` (the current source still sends those aliases, marked for removal); both are read.
SGLang has known counting bugs that report more accepted tokens than were drafted or generated: such a
count is clamped and the record tagged `spec_clamped`, never stored as if it were sound.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from specwatch.gateway.counts import DraftCounts, draft_counts
from specwatch.telemetry.clamps import CLAMPED_TAG, clamp_accepted, clamped_tag
from specwatch.telemetry.schema import MAX_GAMMA

__all__ = ["CLAMPED_TAG", "SglangCounts", "has_spec_counts", "sglang_counts"]
ENGINE_TAGS = {"spec_accept_length": "sglang_accept_length", "spec_accept_rate": "sglang_accept_rate"}
_ACCEPTED = ("spec_num_correct_drafts", "spec_accepted_drafts", "spec_accept_token_num")
_PROPOSED = ("spec_num_proposed_drafts", "spec_proposed_drafts", "spec_draft_token_num")
_HISTOGRAM = ("spec_correct_drafts_histogram", "spec_accept_histogram")


@dataclass(frozen=True)
class SglangCounts:
    """The record's draft counts (None: unreadable) and the tags that keep SGLang's own figures."""

    counts: DraftCounts | None
    tags: dict[str, str] = field(default_factory=dict)


def has_spec_counts(meta_info: Any) -> bool:
    return isinstance(meta_info, dict) and "spec_verify_ct" in meta_info


def sglang_counts(meta_info: dict, completion_tokens: int | None) -> SglangCounts:
    """Draft counts from a `meta_info` with `spec_verify_ct`; a request that never verified drafted nothing."""
    verify_ct = meta_info.get("spec_verify_ct")
    if not _count(verify_ct):
        return SglangCounts(None)
    if verify_ct == 0:
        return SglangCounts(DraftCounts())
    accepted, proposed = _first(meta_info, _ACCEPTED), _first(meta_info, _PROPOSED)
    if not (_count(accepted) and _count(proposed)) or proposed < verify_ct:
        return SglangCounts(None)
    tags = _engine_tags(meta_info)
    clamped, reason = clamp_accepted(accepted, proposed, completion_tokens)
    if reason:
        tags = {**clamped_tag(reason, accepted), **tags}
        return SglangCounts(DraftCounts(verify_ct, proposed, clamped), tags)
    from_histogram = _from_histogram(meta_info, proposed, accepted, verify_ct)
    return SglangCounts(from_histogram or DraftCounts(verify_ct, proposed, accepted), tags)


def _from_histogram(meta_info: dict, proposed: int, accepted: int, verify_ct: int) -> DraftCounts | None:
    """Per-position counts from the histogram, when it agrees with the summary counts (else None)."""
    histogram = _first(meta_info, _HISTOGRAM)
    if not isinstance(histogram, list) or len(histogram) > MAX_GAMMA + 1:
        return None
    counts = draft_counts({"acceptance_histogram": histogram, "num_draft_tokens": proposed})
    if counts is None or (counts.num_drafts, counts.num_accepted_tokens) != (verify_ct, accepted):
        return None
    return counts


def _engine_tags(meta_info: dict) -> dict[str, str]:
    tags = {}
    for key, tag in ENGINE_TAGS.items():
        value = meta_info.get(key)
        if type(value) in (int, float) and value >= 0:
            tags[tag] = f"{value:.6g}"
    return tags


def _first(meta_info: dict, keys: tuple[str, ...]) -> Any:
    return next((meta_info[key] for key in keys if key in meta_info), None)


def _count(value: Any) -> bool:
    return type(value) is int and value >= 0
