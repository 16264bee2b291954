"""The per-request model checked against what was measured, level by level (issue 52: calibration).

At each concurrency level L where both modes were measured (a group's `cost.concurrency` rows: one drafter on
one GPU type, against plain decoding there), the model predicts speculation's device-throughput ratio from

    the step-cost curve at batch L        t_plain(L) = curve(L, 1 row), t_verify(L) = curve(L, gamma + 1 rows),
                                          read at L's own size, or linearly between the measured sizes around it
    the level's speculative requests      drafts D, drafted tokens, accepted A, their draft seconds, ok tokens N:
                                          gamma = drafted / D, t_draft = draft s / drafted,
                                          plain steps inside speculative requests P = N - D - A (rounds that
                                          drafted nothing: the cost-aware lookahead's k = 0)

per request (cost.breakeven's units: each request pays 1/L of a forward and all of its own drafting):

    speculative device s per token = (D (t_verify / L + gamma t_draft) + P t_plain / L) / N
    model ratio                    = (t_plain / L) / that           (> 1: speculation serves more per device-s)

The decode steps only: prefill, sampling and the scheduler's own time are in the measured figures of both
modes and pull the measured ratio towards 1, which the error column shows. Measured beside it:

    measured ratio     plain device s per token / speculative's (the level's rows)
    latency speed-up   plain e2e s per ok token / speculative's (requests binned by their life at the level)
    error              model / measured - 1

A level the curve does not reach (no size at or on both sides of L measured 1 and gamma + 1 rows) has no
model figure and says so; so does a level whose speculative requests drafted nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specwatch.collector.reads.curve_reads import StoredCurve
from specwatch.cost.step_curve import by_batch, seconds_at


@dataclass(frozen=True)
class LevelCheck:
    level: int
    measured_ratio: float | None  # device throughput, speculative / plain, measured
    model_ratio: float | None  # the per-request model's (None: `why`)
    latency_speedup: float | None  # plain e2e per token / speculative's, measured
    error: float | None  # model / measured - 1
    gamma: float | None = None
    mean_acceptance_length: float | None = None
    t_plain_s: float | None = None  # forward of `level` requests, from the curve
    t_verify_s: float | None = None
    t_draft_s: float | None = None
    why: str = ""


def calibrate(rows: Sequence, curves: Sequence[StoredCurve]) -> tuple[LevelCheck, ...]:
    """A LevelCheck per level where both modes have rows (`rows`: one group's cost.concurrency rows)."""
    by_level: dict[int, dict[str, object]] = {}
    for row in rows:
        by_level.setdefault(row.level, {})[row.mode] = row
    return tuple(
        _check(level, modes["speculative"], modes["autoregressive"], curves)
        for level, modes in sorted(by_level.items())
        if len(modes) == 2
    )


def _check(level: int, spec, plain, curves: Sequence[StoredCurve]) -> LevelCheck:
    measured = _ratio(_ratio(plain.device_s, plain.output_tokens), _ratio(spec.device_s, spec.output_tokens))
    latency = _ratio(_ratio(plain.e2e_s, plain.ok_tokens), _ratio(spec.e2e_s, spec.ok_tokens))
    if spec.drafts <= 0 or spec.draft_tokens <= 0 or spec.output_tokens <= 0:
        return LevelCheck(level, measured, None, latency, None, why="nothing drafted at this level")
    gamma = spec.draft_tokens / spec.drafts
    times = times_at(curves, level, gamma)
    if times is None:
        why = f"the step-cost curve has no batch size at or around {level} with 1 and {gamma + 1:.2f} rows measured"
        return LevelCheck(level, measured, None, latency, None, gamma, why=why)
    t_plain, t_verify = times
    t_draft = spec.draft_s / spec.draft_tokens
    plain_steps = max(spec.output_tokens - spec.drafts - spec.accepted_tokens, 0.0)
    spec_per_token = (
        spec.drafts * (t_verify / level + gamma * t_draft) + plain_steps * t_plain / level
    ) / spec.output_tokens
    model = _ratio(t_plain / level, spec_per_token)
    error = model / measured - 1 if model is not None and measured else None
    length = 1 + spec.accepted_tokens / spec.drafts
    return LevelCheck(level, measured, model, latency, error, gamma, length, t_plain, t_verify, t_draft)


def times_at(curves: Sequence[StoredCurve], batch: int, gamma: float) -> tuple[float, float] | None:
    """(t_plain, t_verify) for a forward of `batch` requests: from the curve with most forwards that has both
    at that size, else linearly between the nearest sizes on each side that have both."""
    found = []
    for curve in curves:
        sizes = {}
        for size, points in by_batch(curve).items():
            plain, verify = seconds_at(points, 1.0), seconds_at(points, gamma + 1.0)
            if plain is not None and verify is not None:
                sizes[size] = (plain, verify, sum(p.count for p in points))
        between = _between(sizes, batch)
        if between is not None:
            found.append(between)
    best = max(found, key=lambda f: f[2], default=None)
    return None if best is None else (best[0], best[1])


def _between(sizes: dict[int, tuple[float, float, int]], batch: int) -> tuple[float, float, int] | None:
    if batch in sizes:
        return sizes[batch]
    below = max((b for b in sizes if b < batch), default=None)
    above = min((b for b in sizes if b > batch), default=None)
    if below is None or above is None:
        return None
    w = (batch - below) / (above - below)
    (p0, v0, n0), (p1, v1, n1) = sizes[below], sizes[above]
    return p0 + w * (p1 - p0), v0 + w * (v1 - v0), min(n0, n1)


def _ratio(a: float | None, b: float | None) -> float | None:
    """a / b; None when either is missing or b is not > 0."""
    return a / b if a is not None and b is not None and b > 0 else None
