"""The derived ratios, defined once: raw counts travel, and every reader turns them into ratios here.

    acceptance rate          = accepted / draft tokens     (vLLM's definition; the 0.6 alert applies to it)
    mean acceptance length   = 1 + accepted / drafts       (tokens emitted per target forward while drafting)
    conditional acceptance   = accepted at position 0 / drafts   (the first draft token accepted; p_0)
    acceptance length ratio  = mean acceptance length / (k + 1)  (the share of a step's k + 1 tokens realised)
    drafted step fraction    = drafts / (generated - accepted)  (share of decode steps that drafted at all)

Mean acceptance falls as k grows (later positions need every earlier one accepted), so one threshold on it
means one thing at k = 2 and another at k = 8; conditional acceptance at position 0 does not depend on k.

PromQL over the counters: `rate(..._num_accepted_tokens_total[5m]) / rate(..._num_draft_tokens_total[5m])`.
"""

from __future__ import annotations


def acceptance_rate(accepted: float, draft_tokens: float) -> float | None:
    """Accepted over drafted tokens; None when nothing was drafted (not 0: no evidence either way)."""
    return float(accepted) / float(draft_tokens) if draft_tokens else None


def mean_acceptance_length(accepted: float, drafts: float) -> float | None:
    """1 + accepted / drafts; None when nothing was drafted."""
    return 1.0 + float(accepted) / float(drafts) if drafts else None


def conditional_acceptance(first_position_accepted: float, drafts: float) -> float | None:
    """The share of drafts whose first token was accepted (position 0; every draft proposes it); None
    without drafts."""
    return float(first_position_accepted) / float(drafts) if drafts else None


def acceptance_length_ratio(accepted: float, drafts: float, k: int) -> float | None:
    """Mean acceptance length over the k + 1 tokens a step at k could yield; None without drafts or k."""
    length = mean_acceptance_length(accepted, drafts)
    return None if length is None or k < 1 else length / (k + 1)


def drafted_step_fraction(drafts: float, accepted: float, generated: float) -> float | None:
    """Share of decode steps that drafted, clamped to [0, 1]; None without a decode step.

    A step that drafts yields its accepted tokens plus the target's own, a step that does not yields
    one, so `generated - accepted` counts the decode steps and `drafts` the ones that drafted."""
    steps = float(generated) - float(accepted)
    if steps <= 0:
        return None
    return min(1.0, max(0.0, float(drafts) / steps))
