"""The per-request model checked against what was measured, level by level (issue 52: calibration).

At each concurrency level L where both modes were measured (a group's `cost.concurrency` rows: one drafter on
one GPU type, against plain decoding there), the model predicts speculation's device-throughput ratio from

    the level's speculative requests      drafts D, drafted tokens K, accepted A, their draft seconds, ok
                                          tokens N: rounds R = N - A (each round commits one token beyond
                                          those accepted; R - D of them drafted nothing: the cost-aware
                                          lookahead's k = 0), t_draft = draft s / K, gamma = K / D
    the level's step times                t_plain(L): plain's seconds per target forward at the level, and
                                          t_round(L): speculative's per round (a verify at the mean rows its
                                          forwards fed), both measured over the level's forwards (the records'
                                          verify_s / forwards, binned like the rows); where a level has none,
                                          the step-cost curve at batch L: curve(L, 1 row) and curve(L, 1 + K / R
                                          rows), at L's own size or linearly between the sizes around it

per request (cost.breakeven's units: each request pays 1/L of a forward and all of its own drafting):

    decode s per token, speculative = (R t_round / L + K t_draft) / N
    decode s per token, plain       = t_plain / L
    the rest                        = plain's measured device s per token - t_plain / L: prefill, sampling,
                                      the scheduler's own time, the same per token in both arms of an A/B
                                      (same prompts, same lengths), so taken from plain's measurement
    model ratio                     = plain's measured s per token / (the rest + speculative decode s per token)

so the model predicts speculation's device time per token from the plain arm's measurement, the step times
and the level's acceptance and drafting: it checks the per-request units (each request pays 1/L of a forward,
all of its drafting) against the device time the engine attributed. `curve_ratio` is the same model on the
engine's step-cost curve alone (an exponentially weighted snapshot of the latest forwards, which the
lookahead reads: it can stand far from a level's mean), `decode_ratio` the decode steps alone,
(t_plain / L) / speculative decode s per token. Measured beside them:

    measured ratio     plain device s per token / speculative's (the level's rows)
    latency speed-up   plain e2e s per ok token / speculative's (requests binned by their life at the level)
    error              model / measured - 1

A level with no timed forwards that the curve does not reach either (no size at L, or on both sides of it,
with 1 and 1 + K / R rows within its measured rows) has no model figure and says so; so does a level whose
speculative requests drafted nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from specwatch.collector.reads.curve_reads import StoredCurve
from specwatch.cost.step_curve import by_batch, seconds_at

LEVEL, CURVE = "the level's forwards", "the step-cost curve"  # LevelCheck.times_from


@dataclass(frozen=True)
class LevelCheck:
    level: int
    measured_ratio: float | None  # device throughput, speculative / plain, measured
    model_ratio: float | None  # the per-request model's (None: `why`)
    latency_speedup: float | None  # plain e2e per token / speculative's, measured
    error: float | None  # model / measured - 1
    decode_ratio: float | None = None  # the model's decode steps alone (no prefill or overheads)
    curve_ratio: float | None = None  # the model on the step-cost curve's times (None: the curve lacks them)
    times_from: str = ""  # "the level's forwards" | "the step-cost curve"
    gamma: float | None = None
    mean_acceptance_length: float | None = None
    t_plain_s: float | None = None  # a plain forward of `level` requests (`times_from`)
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
    curve = times_at(curves, level, rows)
    measured_times = (_ratio(plain.verify_s, plain.forwards), _ratio(spec.verify_s, spec.forwards))
    times, source = (measured_times, LEVEL) if None not in measured_times else (curve, CURVE)
    if times is None:
        why = f"no forwards timed at this level, and no step-cost curve at or around {level} with 1 and {rows:.2f} rows"
        return LevelCheck(level, measured, None, latency, None, gamma=gamma, why=why)
    predict = _model(level, spec, plain, rounds)
    model, decode = predict(*times)
    error = model / measured - 1 if model is not None and measured else None
    length = 1 + spec.accepted_tokens / spec.drafts
    curve_ratio = predict(*curve)[0] if curve is not None else None
    t_plain, t_round = times
    return LevelCheck(
        level, measured, model, latency, error, decode, curve_ratio, source, gamma, length, t_plain, t_round,
        spec.draft_s / spec.draft_tokens,
    )  # fmt: skip


def _model(level: int, spec, plain, rounds: float):
    """(t_plain, t_round) -> (model ratio, decode-only ratio) at this level (module docstring)."""
    t_draft = spec.draft_s / spec.draft_tokens
    plain_measured = _ratio(plain.device_s, plain.output_tokens)

    def predict(t_plain: float, t_round: float) -> tuple[float | None, float | None]:
        decode = (rounds * t_round / level + spec.draft_tokens * t_draft) / spec.output_tokens
        rest = max(plain_measured - t_plain / level, 0.0) if plain_measured is not None else None
        return _ratio(plain_measured, None if rest is None else rest + decode), _ratio(t_plain / level, decode)

    return predict


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
