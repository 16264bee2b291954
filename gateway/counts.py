"""A request's draft counts as the RequestRecord holds them, from vLLM's per-request
`metrics.speculative_decoding` (see gateway.records for its shape); gateway.sglang maps SGLang's onto them."""

from __future__ import annotations

from dataclasses import dataclass
from operator import gt
from typing import Any

from specwatch.telemetry.schema import MAX_GAMMA


@dataclass(frozen=True)
class DraftCounts:
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_position: tuple[int, ...] = ()
    drafts_per_position: tuple[int, ...] = ()  # from `detailed` per_step_drafted; () at `summary`

    @property
    def gamma(self) -> int:
        return len(self.accepted_per_position)


def draft_counts(spec: Any) -> DraftCounts | None:
    """The record's draft counts from vLLM's `metrics.speculative_decoding`; None when absent or unreadable."""
    if not isinstance(spec, dict):
        return None
    histogram = spec.get("acceptance_histogram")
    drafted = spec.get("num_draft_tokens")
    if (
        not isinstance(histogram, list)
        or not 1 <= len(histogram) <= MAX_GAMMA + 1
        or not all(type(n) is int and n >= 0 for n in histogram)
        or type(drafted) is not int
    ):
        return None
    per_position, tail = [], 0
    for count in reversed(histogram[1:]):
        tail += count
        per_position.append(tail)
    per_position.reverse()
    reached = drafts_reaching(spec.get("per_step_drafted"), len(per_position))
    if reached and (sum(reached) != drafted or reached[0] > sum(histogram) or any(map(gt, per_position, reached))):
        reached = ()  # lists that disagree with the summary: keep the summary's counts, drop only them
    return DraftCounts(sum(histogram), drafted, sum(per_position), tuple(per_position), reached)


def drafts_reaching(per_step_drafted: Any, gamma: int) -> tuple[int, ...]:
    """Drafts that proposed a token at each position 0..gamma-1, from vLLM's `detailed` per-step drafted
    counts (a step drafting d tokens reached positions 0..d-1); () when absent or unreadable."""
    if not isinstance(per_step_drafted, list) or not all(type(d) is int and 0 <= d <= gamma for d in per_step_drafted):
        return ()
    return tuple(sum(1 for d in per_step_drafted if d > i) for i in range(gamma)) if per_step_drafted else ()
