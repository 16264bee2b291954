"""When does speculation stop paying? Expected speed-up, break-even acceptance and a tornado.

Leviathan et al. (2023), with alpha the probability that the target accepts a drafted token,
gamma the lookahead (tokens drafted per round), c the cost of one drafted token relative to
one plain target step, and v the cost of one verify forward (gamma + 1 tokens) relative to one
plain step — 1 in the paper's idealisation, measured here from telemetry (~1.0-1.1 in bf16 and
~1.3-1.7 in fp32 on a CPU, and it grows with the batch: verify rows take the batch's room):

    E[tokens per round] = (1 - alpha^(gamma+1)) / (1 - alpha)        (-> gamma+1 as alpha -> 1)
    expected speed-up   = E[tokens per round] / (gamma c + v)

E[tokens per round] is the measured mean acceptance length 1 + accepted / drafts, which
gives alpha; c comes from the measured draft_s and verify_s; v = (speculative verify_s per
target forward) / (plain verify_s per target forward), both arms measured in the same window.
For the net benefit at another acceptance, the speculative arm is re-scaled along the formula
from where it was measured (`at_acceptance`): its throughput by S(alpha) / S(alpha measured),
its energy per token by the inverse, everything else held.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
from scipy.optimize import brentq

from cost.model import CostInputs, ModeMeasure, monthly_volume, net_benefit, primary_key

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


def expected_speedup(alpha: float, gamma: float, c: float, v: float = 1.0) -> float:
    """E[tokens per round] / (gamma c + v); (gamma+1)/(gamma c+v) at alpha = 1."""
    if c < 0 or v <= 0:
        raise ValueError("the draft cost ratio c must be >= 0 and the verify cost ratio v > 0")
    return tokens_per_round(alpha, gamma) / (gamma * c + v)


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
    accepted (gamma c + v <= 1); None when even alpha = 1 does not pay ((gamma+1) <= gamma c + v)."""
    cost = gamma * c + v
    if cost <= 1.0:
        return 0.0
    if gamma + 1.0 <= cost:
        return None
    return float(brentq(lambda a: expected_speedup(a, gamma, c, v) - 1.0, 0.0, 1.0, xtol=1e-12))


def verify_cost_ratio(spec: ModeMeasure, plain: ModeMeasure | None) -> float | None:
    """v = seconds per verify forward of the speculative arm / seconds per plain step (module docstring);
    None without both arms' forwards timed."""
    if plain is None or not spec.target_forwards or not plain.target_forwards or plain.verify_s <= 0:
        return None
    spec_forward, plain_step = spec.verify_s / spec.target_forwards, plain.verify_s / plain.target_forwards
    return spec_forward / plain_step if spec_forward > 0 else None


def measured_alpha(arm: ModeMeasure) -> float | None:
    length, gamma = arm.mean_acceptance_length, arm.mean_draft_length
    return None if length is None or not gamma else alpha_from_mean_acceptance_length(length, gamma)


def arm_ratio(arm: ModeMeasure) -> float | None:
    return draft_cost_ratio(arm.draft_s, arm.verify_s, arm.drafts, arm.draft_tokens)


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
    alpha0, c, v = measured_alpha(arm), arm_ratio(arm), verify_cost_ratio(arm, inputs.baseline) or 1.0
    if alpha0 is None or c is None:
        raise ValueError(f"{key}: acceptance or draft cost not measured")
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
    curve: (alpha, expected speed-up, net monthly benefit USD or None) at 21 alphas."""

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


def break_even(inputs: CostInputs) -> tuple[BreakEven, ...]:
    return tuple(_break_even(inputs, arm) for arm in inputs.speculative_arms)


def _break_even(inputs: CostInputs, arm: ModeMeasure) -> BreakEven:
    gamma, c, alpha = arm.mean_draft_length, arm_ratio(arm), measured_alpha(arm)
    plain = inputs.baseline
    measured_v = verify_cost_ratio(arm, plain)
    v = measured_v or 1.0
    modelled = gamma is not None and c is not None
    curve = tuple(
        (
            float(a),
            expected_speedup(a, gamma, c, v) if modelled else None,
            _net_at(inputs, a, arm.key) if modelled and alpha is not None else None,
        )
        for a in np.linspace(0.0, 1.0, 21)
    )
    return BreakEven(
        arm.key,
        gamma,
        c,
        measured_v,
        arm.accepted_tokens / arm.draft_tokens if arm.draft_tokens else None,
        alpha,
        expected_speedup(alpha, gamma, c, v) if modelled and alpha is not None else None,
        arm.tokens_per_s / plain.tokens_per_s if plain else None,
        break_even_alpha(gamma, c, v) if modelled else None,
        benefit_break_even_alpha(inputs, arm.key),
        curve,
    )


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
    if measured_alpha(spec) is not None and arm_ratio(spec) is not None:
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
