"""The tuner's schedule as engines take it, and as a table.

vllm_config(plan)       vLLM's `--speculative-config` JSON: `num_speculative_tokens` (the largest k)
                        and `num_speculative_tokens_per_batch_size` [[start, end, k], ...] (inclusive);
                        None when every bucket should decode plainly (start vLLM without speculation)
trtllm_schedule(plan)   TensorRT-LLM's `draft_len_schedule` {last batch size: draft length}: batch
                        sizes up to the first key take its value, and so on; beyond the last key 0
plan_table(plan)        per bucket: today's k, the recommended k, predicted tokens/s of each with
                        their 95% intervals, the gain and the reason
plan_json(plan)         the schedule, the emitted configs and each bucket's figures as one JSON object
"""

from __future__ import annotations

import dataclasses
import json

from specwatch.cost.tuner import MAX_BATCH, BucketPlan, Schedule, bucket_ranges
from specwatch.telemetry.schema import MAX_GAMMA

DRAFTERS = {"ngram": {"prompt_lookup_max": 3, "prompt_lookup_min": 2}}  # vLLM's n-gram needs its window


def vllm_config(plan: Schedule, method: str | None = None) -> dict | None:
    """The `--speculative-config` object for `plan` (module docstring)."""
    if plan.max_k == 0:
        return None
    method = method or plan.drafter or "ngram"
    config = {"method": method, **DRAFTERS.get(method, {}), "num_speculative_tokens": plan.max_k}
    if not plan.static:  # a static plan: vLLM would drop the schedule (data-parallel size > 1)
        config["num_speculative_tokens_per_batch_size"] = [list(r) for r in plan.ranges]
    return config


def trtllm_schedule(plan: Schedule) -> str:
    """`draft_len_schedule` as Python/YAML-style text, e.g. `{4: 4, 8: 2, 32: 1}`."""
    ranges = list(plan.ranges)
    while ranges and ranges[-1][2] == 0:  # beyond the last key TensorRT-LLM drafts nothing
        ranges.pop()
    return "{" + ", ".join(f"{end}: {k}" for _, end, k in ranges) + "}"


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _with_interval(b: BucketPlan, k: int) -> str:
    tps = b.predicted(k)
    if tps is None:
        return "-"
    if k < len(b.low):
        return f"{tps:.1f} [{b.low[k]:.1f}, {b.high[k]:.1f}]"
    return f"{tps:.1f}"


def plan_table(plan: Schedule) -> list[str]:
    """One line per bucket, then the merged ranges and the notes."""
    lines = [f"{'batch':>9} {'today k':>7} {'k':>3} {'today tok/s':>24} {'recommended tok/s':>24} {'gain':>6}  why"]
    for b in plan.buckets:
        gain = _fmt(b.gain, 2) + ("x" if b.gain is not None else "")
        lines.append(
            f"{b.start:>4}-{b.end:<4} {b.today_k:>7} {b.k:>3} {_with_interval(b, b.today_k):>24} "
            f"{_with_interval(b, b.k):>24} {gain:>6}  {b.reason}"
        )
    lines.append("ranges (start, end, k): " + ", ".join(f"[{s}, {e}, {k}]" for s, e, k in plan.ranges))
    if plan.stale:
        lines.append(f"STALE: {plan.stale_reason}")
    return lines


def sources(plan: Schedule) -> dict[str, list[str]]:
    """Where the figures came from: acceptance and step-cost sources over the buckets with data."""
    return {
        "acceptance": sorted({b.acceptance_source for b in plan.buckets if b.acceptance_source}),
        "step_cost": sorted({b.cost_source for b in plan.buckets if b.cost_source}),
    }


def plan_json(plan: Schedule, method: str | None = None) -> dict:
    """The whole recommendation as one JSON-ready object (the CLI's --json and GET /v1/tune)."""
    buckets = [{**dataclasses.asdict(b), "gain": b.gain} for b in plan.buckets]
    found = {k: v for k, v in dataclasses.asdict(plan).items() if k != "buckets"}
    found["ranges"] = [list(r) for r in plan.ranges]
    vllm = vllm_config(plan, method)
    return {
        **found,
        "buckets": buckets,
        "max_k": plan.max_k,
        "sources": sources(plan),
        "vllm_speculative_config": vllm,
        "vllm_argument": None if vllm is None else "--speculative-config '" + json.dumps(vllm) + "'",
        "trtllm_draft_len_schedule": trtllm_schedule(plan),
    }


def todays_ks(config: object, max_batch: int = MAX_BATCH) -> tuple[int, dict[int, int]]:
    """(num_speculative_tokens, {level: k at the level's own batch size}) of a vLLM speculative config;
    ValueError naming what is wrong. Ranges are inclusive; a batch size no range covers takes the k of
    the range before it (as vLLM's scheduler does), and every k is capped at num_speculative_tokens."""
    if not isinstance(config, dict) or type(config.get("num_speculative_tokens")) is not int:
        raise ValueError("today's config needs an integer num_speculative_tokens")
    k = config["num_speculative_tokens"]
    ranges = config.get("num_speculative_tokens_per_batch_size") or []
    if not isinstance(ranges, list) or not all(
        isinstance(r, list) and len(r) == 3 and all(type(x) is int and x >= 0 for x in r) for r in ranges
    ):
        raise ValueError("num_speculative_tokens_per_batch_size must be [[start, end, k], ...] of whole numbers")
    if not 0 <= k <= MAX_GAMMA or any(not 0 <= r[2] <= MAX_GAMMA for r in ranges):
        raise ValueError(f"num_speculative_tokens and each range's k must be from 0 to {MAX_GAMMA}")
    if ranges and min(r[0] for r in ranges) != 1:
        raise ValueError("the first range must start at 1")
    return k, {level: min(k, _k_at(level, ranges, k)) for level, _, _ in bucket_ranges(max_batch)}


def _k_at(batch: int, ranges: list[list[int]], default: int) -> int:
    found = default
    for start, _, k in sorted(ranges):
        if start <= batch:
            found = k
    return found
