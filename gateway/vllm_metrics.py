"""vLLM's per-request speculative-decoding metrics, version-gated, and why a record's draft counts are unknown.

Sources (vllm-project/vllm): PR #48915 ("Per-request acceptance stats in OpenAI API responses", merged
2026-07, first released in 0.29.0) and `docs/features/speculative_decoding/acceptance_metrics.md`
(commit 02cf515f0b62e6fc36d5ff8fb9b486a30e8dbe08). The feature is marked experimental; its shape changed
during review and after it:

- in review (the same doc at commit cd199986df1171c3255ce2e07e2c63be4385ef9f, and the closed PR #47322
  before it): per choice, `choices[i].speculative_decoding_stats`, a sparse `acceptance_histogram`
  ({"0": 39, "3": 3}), the flag `--per-request-spec-decode-stats`. Never released: not read here.
- released (0.29 on): top level, `metrics.speculative_decoding` = {mean_acceptance_length,
  draft_acceptance_rate, acceptance_histogram (dense, length num_spec_tokens + 1), num_spec_steps,
  num_accepted_draft_tokens, num_draft_tokens, num_spec_tokens}, plus `per_step_accepted` and
  `per_step_drafted` at `detailed`; `null` for n > 1; streamed, it rides the final usage chunk (sent only
  with `stream_options.include_usage`, which the gateway asks for: gateway.proxy).
- later on main: `acceptance_histogram_by_draft_length` ({"k": [k + 1 step counts]}), from which the
  drafts that reached each position are counted at `summary` too (`drafts_per_position`).

A speculative request whose counts cannot be read is stored with `draft_counts_known = False` (its counts
are unknown, not 0: acceptance queries skip it; its timings and tokens, where usage came, still count) and
tagged `spec_counts_unknown=<reason>`; the gateway's /metrics counts them by reason (gateway.metrics).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from specwatch.gateway.counts import DraftCounts, draft_counts
from specwatch.telemetry.schema import MAX_GAMMA

UNKNOWN_TAG = "spec_counts_unknown"
SINCE = (0, 29)  # the first release with `metrics.speculative_decoding`
RELEASE = re.compile(r"^v?(\d+)\.(\d+)(?:\.(\d+))?(?:\.post\d+)?$")  # a release, not a dev or rc build
# Why a speculative request's draft counts are unknown (the tag's values and the counter's `reason`).
N_GT_1 = "n_gt_1"  # vLLM reports per-request metrics for single-sequence requests only
NO_USAGE = "no_usage"  # a stream that ended without its final usage chunk, which carries the metrics
ENGINE_VERSION = "engine_version"  # a vLLM release before 0.29: it has no per-request draft counts
NOT_REPORTED = "not_reported"  # none sent: the server was not started with --per-request-spec-decode-metrics
UNREADABLE = "unreadable"  # sent, but not in a shape read here (or counts that contradict each other)
REASONS = (N_GT_1, NO_USAGE, ENGINE_VERSION, NOT_REPORTED, UNREADABLE)


@dataclass(frozen=True)
class SpecRead:
    counts: DraftCounts | None  # None: unknown
    unknown: str | None = None  # one of REASONS when counts is None


def before_per_request_metrics(version: str | None) -> bool:
    """True only for a vLLM release known to predate per-request metrics (a dev build of 0.28 may carry them)."""
    found = RELEASE.match(version or "")
    return bool(found) and (int(found[1]), int(found[2])) < SINCE


def read(metrics: dict, *, n: int = 1, streamed: bool = False, usage: bool = True, version: str | None = None):
    """The draft counts of one vLLM answer's top-level `metrics`, or why they are unknown.

    `n`: the request's choices; `streamed`/`usage`: whether it was streamed and its usage chunk came;
    `version`: the upstream's vLLM version (its /version, gateway.markers), None when not known."""
    spec = metrics.get("speculative_decoding")
    if spec is not None:
        counts = draft_counts(spec)
        return SpecRead(_with_drafts_per_length(counts, spec)) if counts else SpecRead(None, UNREADABLE)
    if n > 1:
        return SpecRead(None, N_GT_1)
    if streamed and not usage:
        return SpecRead(None, NO_USAGE)
    return SpecRead(None, ENGINE_VERSION if before_per_request_metrics(version) else NOT_REPORTED)


def _with_drafts_per_length(counts: DraftCounts, spec: dict) -> DraftCounts:
    """`drafts_per_position` from `acceptance_histogram_by_draft_length` where `detailed` gave none."""
    if counts.drafts_per_position:
        return counts
    reached = drafts_reaching_by_length(spec.get("acceptance_histogram_by_draft_length"), spec, counts.gamma)
    return replace(counts, drafts_per_position=reached) if reached else counts


def drafts_reaching_by_length(by_length: Any, spec: dict, gamma: int) -> tuple[int, ...]:
    """Drafts that proposed a token at each position 0..gamma-1: a step of k draft tokens reached positions
    0..k-1. () when absent, malformed, or when its rows disagree with the summary (the summary's counts stand)."""
    rows = _rows(by_length, gamma)
    if not rows:
        return ()
    histogram = spec["acceptance_histogram"]
    summed = [sum(row[j] for row in rows.values() if j < len(row)) for j in range(len(histogram))]
    drafted = sum(k * sum(row) for k, row in rows.items())
    if summed != histogram or drafted != spec["num_draft_tokens"]:
        return ()
    return tuple(sum(sum(row) for k, row in rows.items() if k > i) for i in range(gamma))


def _rows(by_length: Any, gamma: int) -> dict[int, list[int]]:
    if not isinstance(by_length, dict) or not by_length:
        return {}
    rows = {}
    for key, row in by_length.items():
        if not (isinstance(key, str) and key.isdecimal() and int(key) <= min(gamma, MAX_GAMMA)):
            return {}
        if not (isinstance(row, list) and len(row) == int(key) + 1 and all(type(c) is int and c >= 0 for c in row)):
            return {}
        rows[int(key)] = row
    return rows
