"""The canary's decision: promote the candidate (the gateway's spec pool) or roll back to today's config
(its plain pool), from the collector's A/B comparison of the arms (`collector.reads.breakdown.compare`,
served as `GET /v1/compare?by=arm`: speed-up = control mean s/token / candidate mean s/token, and the
two-sided Mann-Whitney U p-value on the per-request s/token).

In order, the first rule that applies decides:

1. either arm has fewer than `min_requests` ok requests   -> rollback (not enough data)
2. the arms' mean loads differ by more than `max_load_gap`  -> rollback (load not matched)
3. the candidate's error share exceeds control's by more
   than `max_error_gap`                                     -> rollback (errors)
4. p < alpha and speed-up > 1                               -> promote (a significant win)
5. p < alpha and speed-up < 1                               -> rollback (a significant loss)
6. otherwise                                                -> rollback (no significant difference)

Only a significant win changes the fleet: anything else keeps today's config (share 0).
"""

from __future__ import annotations

from dataclasses import dataclass

PROMOTE, ROLLBACK = "promote", "rollback"
SHARE_AFTER = {PROMOTE: 1.0, ROLLBACK: 0.0}


@dataclass(frozen=True)
class CanaryRules:
    alpha: float = 0.05
    min_requests: int = 20  # ok requests in each arm
    max_load_gap: float = 0.25  # |mean load candidate - mean load control|, load = (running + waiting) / capacity
    max_error_gap: float = 0.02  # candidate error share - control error share

    def __post_init__(self) -> None:
        if not 0.0 < self.alpha < 1.0:
            raise ValueError("alpha must be between 0 and 1")
        if self.min_requests < 2:
            raise ValueError("min_requests must be at least 2 (the test needs two per arm)")
        if self.max_load_gap < 0 or self.max_error_gap < 0:
            raise ValueError("max_load_gap and max_error_gap must be >= 0")


@dataclass(frozen=True)
class Arm:
    """One arm's figures: requests (ok or not), errors, mean seconds per output token of its ok requests,
    and the mean load of its pool sampled while the canary ran (None: never sampled)."""

    requests: int = 0
    errors: int = 0
    s_per_token: float | None = None
    load: float | None = None

    @property
    def ok(self) -> int:
        return self.requests - self.errors

    @property
    def error_share(self) -> float:
        return self.errors / self.requests if self.requests else 0.0

    def as_detail(self) -> dict:
        ms = None if self.s_per_token is None else round(self.s_per_token * 1000.0, 4)
        tokens_per_s = None if not self.s_per_token else round(1.0 / self.s_per_token, 3)
        load = None if self.load is None else round(self.load, 4)
        return {"requests": self.requests, "errors": self.errors, "ms_per_token": ms, "tokens_per_s": tokens_per_s,
                "load": load}  # fmt: skip


@dataclass(frozen=True)
class Verdict:
    decision: str  # promote | rollback
    reason: str

    @property
    def share_after(self) -> float:
        return SHARE_AFTER[self.decision]


def _p(p: float | None) -> str:
    return "n/a" if p is None else f"{p:.3g}"


def decide(candidate: Arm, control: Arm, speedup: float | None, p_value: float | None, rules: CanaryRules) -> Verdict:
    """The verdict of the rules above (the module docstring)."""
    if min(candidate.ok, control.ok) < rules.min_requests:
        return Verdict(
            ROLLBACK,
            f"not enough data ({candidate.ok} candidate, {control.ok} control ok requests; need {rules.min_requests} "
            "each): keeps today's config",
        )
    if _load_gap(candidate, control) > rules.max_load_gap:
        return Verdict(
            ROLLBACK,
            f"load not matched (candidate {candidate.load:.2f}, control {control.load:.2f}; at most "
            f"{rules.max_load_gap:g} apart): keeps today's config; give the share that matches the pools' capacity",
        )
    if candidate.error_share > control.error_share + rules.max_error_gap:
        return Verdict(
            ROLLBACK,
            f"candidate errors {candidate.error_share:.1%} against control {control.error_share:.1%}",
        )
    return _by_speed(speedup, p_value, rules.alpha)


def _load_gap(candidate: Arm, control: Arm) -> float:
    """How far apart the arms' mean loads were (0 when either was never sampled)."""
    return 0.0 if candidate.load is None or control.load is None else abs(candidate.load - control.load)


def _by_speed(speedup: float | None, p_value: float | None, alpha: float) -> Verdict:
    if speedup is None or p_value is None:
        return Verdict(ROLLBACK, "no comparison (an arm has no timed ok requests): keeps today's config")
    measured = f"speed-up {speedup:.3f}x (control ms/token / candidate ms/token), Mann-Whitney p={_p(p_value)}"
    if p_value < alpha and speedup > 1.0:
        return Verdict(PROMOTE, f"candidate significantly faster: {measured} < alpha {alpha:g}")
    if p_value < alpha:
        return Verdict(ROLLBACK, f"candidate significantly slower: {measured} < alpha {alpha:g}")
    return Verdict(ROLLBACK, f"no significant difference: {measured} >= alpha {alpha:g}: keeps today's config")
