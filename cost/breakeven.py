"""When does speculation stop paying? Expected speed-up, break-even acceptance and a tornado.

Leviathan et al. (2023), with alpha the probability that the target accepts a drafted token and
gamma the lookahead (tokens drafted per round), per request, in seconds, at batch size b (b requests
share each target forward; the engine drafts request by request):

    E[tokens per round] = (1 - alpha^(gamma+1)) / (1 - alpha)        (-> gamma+1 as alpha -> 1)
    S(alpha)            = E[tokens per round] x (t_plain(b) / b) / (t_verify(gamma, b) / b + gamma x t_draft)

t_plain(b): seconds per plain forward of b requests, t_verify(gamma, b): per verify forward of b requests,
t_draft: one request's seconds per drafted token. A request pays its 1/b share of a forward and all of its
own drafting, so S is both the device-throughput ratio and, the b requests running round by round, the
latency speed-up at that batch. As ratios, c = t_draft / (t_verify / b) (`StepInputs.c`: one request's
draft time relative to its share of the verify forward) and v = t_verify / t_plain, a round costs
v (gamma c + 1) plain steps: with c = 0.2 and v = 1.5 at gamma = 4, break-even alpha is 0.686 (not 0.599,
which gamma c + v gives by mixing units). Setting c against the whole batched forward instead (per batch
for the verify, per request for the draft) overstates S b-fold in the draft term: at b = 16 it reads a
0.55x slowdown as 2.2x.

Where the times come from (`times_from`, shown in the API, the CLI table and the Cost page):

- `step_curve`: the engine's measured step-cost curve, the latest `step_costs` event in the window of an
  instance that served the arm (cost.step_curve): t_plain(b) = curve(b, 1 row per request) and
  t_verify(gamma, b) = curve(b, gamma + 1 rows) at the same batch size b, the one it ran most forwards
  at; t_draft is the records' draft seconds per drafted token.
- `records`: vLLM upstreams (no curve), or a curve that lacks the rows needed, or an engine's arm with no
  curve stored (both warned): the step timings of one concurrency level where both arms were measured
  (the one where speculation served most forwards), so the batch is the same for both: `verify_s` holds
  whole batched forwards, and comparing forwards of different batch sizes confounds v. When no level
  has both, the window's totals are used and the figure says it may be confounded.
- `not measured`: no curve and no plain arm: no curve is drawn (never a silent v = 1).
v < 1 is flagged whatever the source.

E[tokens per round] is the measured mean acceptance length 1 + accepted / drafts, which gives
alpha. For the net benefit at another acceptance, the speculative arm is re-scaled along the formula
from where it was measured (`at_acceptance`): its throughput by S(alpha) / S(alpha measured), its
energy per token by the inverse, everything else held.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import brentq

from specwatch.collector.reads.curve_reads import CurvePoint
from specwatch.cost.model import CostInputs, ModeMeasure, monthly_volume, net_benefit, primary_key
from specwatch.cost.step_inputs import NOT_MEASURED, RECORDS, STEP_CURVE, StepInputs, per_forward, step_inputs
from specwatch.telemetry import ratios

__all__ = ["NOT_MEASURED", "RECORDS", "STEP_CURVE", "StepInputs", "step_inputs"]  # re-exported

_ONE = 1.0 - 1e-12  # above this, alpha is taken as 1 (the formula's limit)


def tokens_per_round(alpha: float, gamma: float) -> float:
    """E[accepted + 1] = (1 - alpha^(gamma+1)) / (1 - alpha) = 1 + alpha + ... + alpha^gamma."""
    if not 0.0 <= alpha <= 1.0 or gamma < 0:
        raise ValueError("alpha must be in [0, 1] and gamma >= 0")
    if alpha >= _ONE:
        return gamma + 1.0
    if alpha == 0.0:
        return 1.0
    return -math.expm1((gamma + 1) * math.log(alpha)) / (1.0 - alpha)


def round_cost(gamma: float, c: float, v: float = 1.0) -> float:
    """Plain steps one round costs: v (gamma c + 1), c relative to the verify forward, v to a plain step."""
    if c < 0 or v <= 0:
        raise ValueError("the draft cost ratio c must be >= 0 and the verify cost ratio v > 0")
    return v * (gamma * c + 1.0)


def expected_speedup(alpha: float, gamma: float, c: float, v: float = 1.0) -> float:
    """E[tokens per round] / (v (gamma c + 1)) (module docstring)."""
    return tokens_per_round(alpha, gamma) / round_cost(gamma, c, v)


def speedup_from_times(alpha: float, gamma: float, t_plain: float, t_verify: float, t_draft: float) -> float:
    """S(alpha) = E x t_plain / (t_verify + gamma t_draft), the three times at one batch size."""
    if t_plain <= 0 or t_verify <= 0 or t_draft < 0:
        raise ValueError("step times must be > 0 (draft time >= 0)")
    return tokens_per_round(alpha, gamma) * t_plain / (t_verify + gamma * t_draft)


def alpha_from_mean_acceptance_length(length: float, gamma: float) -> float:
    """The alpha whose E[tokens per round] equals the measured mean acceptance length
    (brentq; clipped to 0 at length <= 1 and to 1 at length >= gamma + 1)."""
    if gamma <= 0:
        raise ValueError("gamma must be > 0")
    if length <= 1.0:
        return 0.0
    if length >= gamma + 1.0:
        return 1.0
    return float(brentq(lambda a: tokens_per_round(a, gamma) - length, 0.0, 1.0, xtol=1e-12))


def draft_cost_ratio(draft_s: float, verify_s: float, drafts: int, draft_tokens: int) -> float | None:
    """c = seconds per drafted token / seconds per verification (one target forward per round)
    = (draft_s / draft_tokens) / (verify_s / drafts).  None when not measured."""
    if drafts <= 0 or draft_tokens <= 0 or verify_s <= 0:
        return None
    return (draft_s / draft_tokens) / (verify_s / drafts)


def break_even_alpha(gamma: float, c: float, v: float = 1.0) -> float | None:
    """The alpha where the expected speed-up is 1 (brentq). 0 when a round pays even with nothing
    accepted (its cost <= 1 plain step); None when even alpha = 1 does not pay (gamma + 1 <= its cost)."""
    cost = round_cost(gamma, c, v)
    if cost <= 1.0:
        return 0.0
    if gamma + 1.0 <= cost:
        return None
    return float(brentq(lambda a: expected_speedup(a, gamma, c, v) - 1.0, 0.0, 1.0, xtol=1e-12))


def verify_cost_ratio(spec: ModeMeasure, plain: ModeMeasure | None) -> float | None:
    """v from the two arms' totals: seconds per verify forward / seconds per plain step (None: not timed)."""
    if plain is None:
        return None
    spec_forward, plain_step = (
        per_forward(spec.verify_s, spec.target_forwards),
        per_forward(plain.verify_s, plain.target_forwards),
    )
    return spec_forward / plain_step if spec_forward and plain_step else None


def measured_alpha(arm: ModeMeasure) -> float | None:
    length, gamma = arm.mean_acceptance_length, arm.mean_draft_length
    return None if length is None or not gamma else alpha_from_mean_acceptance_length(length, gamma)


def _arm(inputs: CostInputs, key: str) -> ModeMeasure:
    found = next((arm for arm in inputs.arms if arm.key == key), None)
    if found is None:
        raise ValueError(f"no arm {key!r}")
    return found


def _with_arm(inputs: CostInputs, key: str, **changes) -> CostInputs:
    return replace(inputs, arms=tuple(replace(a, **changes) if a.key == key else a for a in inputs.arms))


def at_acceptance(inputs: CostInputs, alpha: float, key: str) -> CostInputs:
    """The inputs as if arm `key` had acceptance `alpha` (see the module docstring)."""
    arm = _arm(inputs, key)
    steps = step_inputs(inputs, arm)
    alpha0, c, v = measured_alpha(arm), steps.c, steps.v
    if alpha0 is None or c is None or v is None:
        raise ValueError(f"{key}: acceptance, draft cost or verify cost not measured")
    gamma = arm.mean_draft_length
    scale = expected_speedup(alpha, gamma, c, v) / expected_speedup(alpha0, gamma, c, v)
    energy = None if arm.energy_j_per_token is None else arm.energy_j_per_token / scale
    return _with_arm(inputs, key, tokens_per_s=arm.tokens_per_s * scale, energy_j_per_token=energy)


def _net_at(inputs: CostInputs, alpha: float, key: str) -> float | None:
    return net_benefit(at_acceptance(inputs, alpha, key), key)


def benefit_break_even_alpha(inputs: CostInputs, key: str | None = None) -> float | None:
    """The alpha where the net monthly benefit of arm `key` crosses 0 (brentq over [0, 1]);
    None when it does not cross (always pays, never pays) or cannot be modelled."""
    key = key or primary_key(inputs)
    if key is None or inputs.baseline is None:
        return None
    try:
        low, high = _net_at(inputs, 0.0, key), _net_at(inputs, 1.0, key)
    except ValueError:
        return None
    if low == 0.0:
        return 0.0
    if np.sign(low) == np.sign(high):
        return None
    return float(brentq(lambda a: _net_at(inputs, a, key), 0.0, 1.0, xtol=1e-9))


@dataclass(frozen=True)
class BreakEven:
    """One speculative arm: measured acceptance against where speculation stops paying.

    speedup_alpha: alpha at speed-up 1; benefit_alpha: alpha at net monthly benefit 0.
    curve: (alpha, expected speed-up, net monthly benefit USD or None) at 21 alphas (empty: v or c
    not measured). t_*_s, level, source and warnings: the times the curve rests on (`step_inputs`)."""

    key: str
    gamma: float | None
    draft_cost_ratio: float | None
    verify_cost_ratio: float | None  # measured (None: not measured, the formula then takes 1)
    acceptance_rate: float | None
    measured_alpha: float | None
    model_speedup: float | None  # the formula at the measured alpha
    measured_speedup: float | None  # tokens/s of this arm / tokens/s of plain decoding
    speedup_alpha: float | None
    benefit_alpha: float | None
    curve: tuple[tuple[float, float | None, float | None], ...]
    t_plain_s: float | None = None
    t_verify_s: float | None = None
    t_draft_s: float | None = None
    level: int | None = None
    source: str = ""
    warnings: tuple[str, ...] = ()
    times_from: str = ""  # step_curve | records | not measured (StepInputs.times_from)
    batch: int | None = None  # requests per forward the times were read at (the curve's size, or the level)
    curve_instance: str | None = None
    step_points: tuple[CurvePoint, ...] = ()  # the curve's measured points at that batch (step_curve)


def break_even(inputs: CostInputs) -> tuple[BreakEven, ...]:
    return tuple(_break_even(inputs, arm) for arm in inputs.speculative_arms)


def _break_even(inputs: CostInputs, arm: ModeMeasure) -> BreakEven:
    steps = step_inputs(inputs, arm)
    gamma, c, v, alpha = arm.mean_draft_length, steps.c, steps.v, measured_alpha(arm)
    plain = inputs.baseline
    modelled = gamma is not None and c is not None and v is not None
    curve = tuple(
        (
            float(a),
            expected_speedup(a, gamma, c, v),
            _net_at(inputs, a, arm.key) if alpha is not None else None,
        )
        for a in np.linspace(0.0, 1.0, 21)
        if modelled
    )
    return BreakEven(
        arm.key,
        gamma,
        c,
        v,
        ratios.acceptance_rate(arm.accepted_tokens, arm.draft_tokens),
        alpha,
        expected_speedup(alpha, gamma, c, v) if modelled and alpha is not None else None,
        arm.tokens_per_s / plain.tokens_per_s if plain else None,
        break_even_alpha(gamma, c, v) if modelled else None,
        benefit_break_even_alpha(inputs, arm.key),
        curve,
        steps.t_plain,
        steps.t_verify,
        steps.t_draft,
        steps.level,
        steps.source,
        steps.warnings,
        steps.times_from,
        *_curve_fields(steps),
    )


def _curve_fields(steps: StepInputs) -> tuple:
    """(batch, curve instance, curve points): the batch is known from a curve or a concurrency level."""
    found = steps.curve
    batch = steps.batch if found is not None or steps.level is not None else None
    return (batch, None, ()) if found is None else (batch, found.instance, found.points)


@dataclass(frozen=True)
class TornadoRow:
    """Net monthly benefit (USD) with one input at low and at high, the rest at base."""

    name: str
    base: float
    low: float
    high: float
    net_at_low: float
    net_at_high: float
    swing: float  # |net_at_high - net_at_low|


_PRICE_FIELDS = ("electricity_usd_per_kwh", "pue", "storage_usd_per_gb_month", "engineer_day_usd")
_HIDDEN_FIELDS = (
    "draft_training_usd",
    "amortisation_months",
    "monitoring_gb_per_day",
    "incident_days_per_week",
    "tech_debt_buffer",
)  # the tornado's hidden inputs (with HiddenCosts.with_values, each a "given" what-if)
_BOUNDS = {
    "pue": (1.0, math.inf),
    "tech_debt_buffer": (0.0, 10.0),
    "acceptance (alpha)": (0.0, 1.0),
    "amortisation_months": (1e-9, math.inf),
}


def _knobs(inputs: CostInputs, key: str) -> dict[str, tuple[float, Callable[[float], CostInputs]]]:
    """Input name -> (base value, inputs with that value)."""
    p, h = inputs.prices, inputs.hidden
    knobs = {
        "gpu_hour_usd": (inputs.gpu_hour_usd, lambda v: replace(inputs, prices=p.with_gpu_hour(inputs.gpu_type, v))),
        "monthly_output_tokens": (monthly_volume(inputs)[0], lambda v: replace(inputs, monthly_output_tokens=v)),
    }
    knobs |= {n: (getattr(p, n), lambda v, n=n: replace(inputs, prices=replace(p, **{n: v}))) for n in _PRICE_FIELDS}
    knobs |= {
        n: (getattr(h, n), lambda v, n=n: replace(inputs, hidden=h.with_values(h.source(n), **{n: v})))
        for n in _HIDDEN_FIELDS
    }
    for arm in (_arm(inputs, key), inputs.baseline):
        knobs[f"{arm.key} tokens_per_s"] = (arm.tokens_per_s, lambda v, k=arm.key: _with_arm(inputs, k, tokens_per_s=v))
        if arm.energy_j_per_token is not None:
            knobs[f"{arm.key} energy_j_per_token"] = (
                arm.energy_j_per_token,
                lambda v, k=arm.key: _with_arm(inputs, k, energy_j_per_token=v),
            )
    spec = _arm(inputs, key)
    knobs[f"{key} draft_memory_bytes"] = (
        spec.draft_memory_bytes,
        lambda v: _with_arm(inputs, key, draft_memory_bytes=v),
    )
    steps = step_inputs(inputs, spec)
    if measured_alpha(spec) is not None and steps.c is not None and steps.v is not None:
        knobs["acceptance (alpha)"] = (measured_alpha(spec), lambda v: at_acceptance(inputs, v, key))
    return knobs


def sensitivity(inputs: CostInputs, spread: float = 0.2, key: str | None = None) -> list[TornadoRow]:
    """Tornado rows: each input at base x (1 - spread) and x (1 + spread) (within its bounds),
    sorted by the swing of the net monthly benefit, widest first. [] without a plain arm."""
    if not 0 < spread < 1:
        raise ValueError("spread must be in (0, 1)")
    key = key or primary_key(inputs)
    if key is None or inputs.baseline is None:
        return []
    rows = []
    for name, (base, build) in _knobs(inputs, key).items():
        lower, upper = _BOUNDS.get(name, (0.0, math.inf))
        low, high = max(lower, base * (1 - spread)), min(upper, base * (1 + spread))
        at_low, at_high = net_benefit(build(low), key), net_benefit(build(high), key)
        rows.append(TornadoRow(name, base, low, high, at_low, at_high, abs(at_high - at_low)))
    return sorted(rows, key=lambda row: -row.swing)
