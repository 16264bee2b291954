"""The per-request model checked against what was measured, level by level (issue 52: calibration).

At each concurrency level L where both modes were measured (a group's `cost.concurrency` rows: one drafter on
one GPU type, against plain decoding there), the model predicts speculation's device-throughput ratio from

    the level's speculative requests      drafts D, drafted tokens K, accepted A, their draft seconds, ok
                                          tokens N: rounds R = N - A (each round commits one token beyond
                                          those accepted; R - D of them drafted nothing: the cost-aware
                                          lookahead's k = 0), t_draft = draft s / K, gamma = K / D
    the step-cost curve at batch L        t_plain(L) = curve(L, 1 row per request) and t_round(L) =
                                          curve(L, 1 + K / R rows per request), the mean rows its forwards
                                          fed; at L's own size, or linearly between the sizes around it

per request (cost.breakeven's units: each request pays 1/L of a forward and all of its own drafting):

    decode s per token, speculative = (R t_round / L + K t_draft) / N
    decode s per token, plain       = t_plain / L
    the rest                        = plain's measured device s per token - t_plain / L: prefill, sampling,
                                      the scheduler's own time, the same per token in both arms of an A/B
                                      (same prompts, same lengths), so taken from plain's measurement
    model ratio                     = plain's measured s per token / (the rest + speculative decode s per token)

so the model predicts speculation from the plain arm's measurement, the curve and the level's acceptance;
`decode_ratio` is the decode steps alone, (t_plain / L) / speculative decode s per token. Measured beside it:

    measured ratio     plain device s per token / speculative's (the level's rows)
    latency speed-up   plain e2e s per ok token / speculative's (requests binned by their life at the level)
    error              model / measured - 1

A level the curve does not reach (no size at L, or on both sides of it, with 1 and 1 + K / R rows within its
measured rows) has no model figure and says so; so does a level whose speculative requests drafted nothing.
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
    decode_ratio: float | None = None  # the model's decode steps alone (no prefill or overheads)
    gamma: float | None = None
    mean_acceptance_length: float | None = None
    t_plain_s: float | None = None  # forward of `level` requests, from the curve
    t_round_s: float | None = None  # a forward of `level` requests at the mean rows the speculative ones fed
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
    rounds = max(spec.output_tokens - spec.accepted_tokens, spec.drafts)
    rows = 1 + spec.draft_tokens / rounds
    times = times_at(curves, level, rows)
    if times is None:
        why = f"the step-cost curve has no batch size at or around {level} with 1 and {rows:.2f} rows measured"
        return LevelCheck(level, measured, None, latency, None, None, gamma, why=why)
    t_plain, t_round = times
    t_draft = spec.draft_s / spec.draft_tokens
    decode = (rounds * t_round / level + spec.draft_tokens * t_draft) / spec.output_tokens
    plain_measured = _ratio(plain.device_s, plain.output_tokens)
    rest = max(plain_measured - t_plain / level, 0.0) if plain_measured is not None else None
    model = _ratio(plain_measured, None if rest is None else rest + decode)
    error = model / measured - 1 if model is not None and measured else None
    length = 1 + spec.accepted_tokens / spec.drafts
    decode_ratio = _ratio(t_plain / level, decode)
    return LevelCheck(level, measured, model, latency, error, decode_ratio, gamma, length, t_plain, t_round, t_draft)


def times_at(curves: Sequence[StoredCurve], batch: int, rows: float) -> tuple[float, float] | None:
    """(seconds at 1 row, at `rows` rows per request) for a forward of `batch` requests: from the curve with
    most forwards that has both at that size, else linearly between the nearest sizes on each side that do."""
    found = []
    for curve in curves:
        sizes = {}
        for size, points in by_batch(curve).items():
            plain, verify = seconds_at(points, 1.0), seconds_at(points, rows)
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
