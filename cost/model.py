"""The cost model (TCO) of speculative decoding: pure functions over one frozen `CostInputs`.

No I/O here: `cost.inputs` builds the inputs (from the store, a TOML file or the
shipped price table), `cost.breakeven` asks when speculation stops paying.

Every dollar comes from one allocation (`cost.allocation.allocate`): each instance's bill split into
arm, retries, idle and other-tenant lines that add up to it. Per arm (a mode and drafter:
"autoregressive", "speculative:ngram", ...), per 1M output tokens, with rates per ok device-second
taken from the arm's lines (so at the measured throughput the figures are the lines themselves):

    gpu_hours_per_mtok = gpu_count x 1e6 / tokens_per_s / 3600                           [GPU h]
                         (gpu_count of its instances, weighted by its device time there)
    compute_usd        = 1e6 / tokens_per_s x (arm lines' compute $ / ok device_s)       [$]
                         (one device: = gpu_hours_per_mtok x $/GPU-hour x memory_share; a mixed
                         fleet: each instance's lines at its own rate)
    energy_kwh         = energy_j_per_token x 1e6 / 3.6e6 (ok work only)                 [kWh]
    energy_usd         = energy_kwh x PUE x $/kWh x share: added for the part on on-prem instances
                         only (a cloud GPU-hour price already pays for power: shown for information)
    retries_usd        = 1e6 / tokens_per_s x (retries lines' $ / ok device_s)
    idle_usd           = 1e6 / tokens_per_s x (idle lines charged to the arm / ok device_s)
    total_usd          = compute_usd + energy_usd added + retries_usd + idle_usd         [$ / 1M tokens]

Per month, the whole volume V served one way: `monthly_usd = total_usd x V / 1e6`. Hidden monthly
costs of running speculation (see `hidden_monthly`) are subtracted from what it saves against plain
decoding (`benefits`); the technical-debt reserve is a fraction of what speculation adds, and the
verdict is given with and without it. Each input's value and source are listed by `assumptions`.
"""

from __future__ import annotations

from dataclasses import dataclass

from specwatch.cost.allocation import Allocation, allocate
from specwatch.cost.assumptions import assumptions, estimated_from, notes
from specwatch.cost.hidden import HiddenMonthly, draft_fraction, draft_memory_monthly, hidden_monthly, training_run_usd
from specwatch.cost.terms import (
    DAYS_PER_MONTH,
    GB,
    HIDDEN_FIELDS,
    HIDDEN_UNITS,
    J_PER_KWH,
    MODES,
    MTOK,
    PRICINGS,
    SECONDS_PER_MONTH,
    SEED,
    UNTRAINED_DRAFTERS,
    UNTRAINED_PREFIXES,
    WEEKS_PER_MONTH,
    Accelerator,
    ArmUse,
    Assumption,
    CostInputs,
    HiddenCosts,
    IdleTime,
    InstanceUse,
    ModeMeasure,
    Prices,
    monthly_volume,
    needs_training,
)

# the inputs' types are re-exported from cost.terms
__all__ = [
    "SECONDS_PER_MONTH",
    "DAYS_PER_MONTH",
    "WEEKS_PER_MONTH",
    "J_PER_KWH",
    "MTOK",
    "GB",
    "MODES",
    "UNTRAINED_DRAFTERS",
    "UNTRAINED_PREFIXES",
    "PRICINGS",
    "SEED",
    "Accelerator",
    "Prices",
    "HiddenCosts",
    "HIDDEN_FIELDS",
    "HIDDEN_UNITS",
    "ModeMeasure",
    "IdleTime",
    "CostInputs",
    "ArmCost",
    "HiddenMonthly",
    "Benefit",
    "IdleCost",
    "Assumption",
    "Tco",
    "monthly_volume",
    "memory_share",
    "draft_fraction",
    "draft_memory_monthly",
    "Allocation",
    "allocate",
    "arm_cost",
    "idle_cost",
    "needs_training",
    "hidden_monthly",
    "training_run_usd",
    "benefit",
    "tco",
    "estimated_from",
    "primary_key",
    "net_benefit",
    "notes",
]


@dataclass(frozen=True)
class ArmCost:
    """One arm's cost per 1M output tokens (USD) and per month at the model's volume."""

    key: str
    mode: str
    drafter: str | None
    memory_share: float  # the deployment's share of its instances' devices (device-time weighted)
    memory_source: str
    gpu_hours_per_mtok: float
    compute_usd_per_mtok: float
    energy_kwh_per_mtok: float | None
    energy_usd_per_mtok: float  # what the energy costs (0 when not measured), added only when energy_added
    energy_source: str | None
    energy_added: bool  # False: shown for information (a cloud price already pays for power, everywhere it ran)
    retry_factor: float
    retries_usd_per_mtok: float
    idle_usd_per_mtok: float  # idle time charged to the arm (0 when idle is its own line)
    total_usd_per_mtok: float
    monthly_usd: float
    device_s_source: str
    window_usd: float = 0.0  # the arm's lines in the window: its work, its retries, the idle charged to it
    estimate: bool = False  # part of its device time derived from request times: shown with "~"


@dataclass(frozen=True)
class Benefit:
    """Speculation with one drafter against plain decoding, per month (USD).

    explicit_saving_usd    = plain monthly_usd - speculative monthly_usd
    net_usd                = explicit_saving_usd - hidden.total_usd (the reserve included)
    net_without_reserve_usd= explicit_saving_usd - (hidden.total_usd - hidden.tech_debt_usd)
    payback_months         = draft training / (explicit saving - recurring hidden costs incl. reserve),
                             None when that saving is <= 0 (the training never pays back).
    estimated_from         = the inputs behind net_usd that are estimates or seed defaults, not measured
                             or given (empty: every input was)."""

    key: str
    drafter: str | None
    explicit_saving_usd: float
    hidden: HiddenMonthly
    net_usd: float
    payback_months: float | None
    estimated_from: tuple[str, ...] = ()
    net_without_reserve_usd: float = 0.0


@dataclass(frozen=True)
class IdleCost:
    """Instance time no request used: in the window and per month at the window's proportion."""

    up_s: float
    idle_s: float
    idle_fraction: float
    monthly_usd: float
    energy_kwh_per_month: float | None
    allocation: str
    window_usd: float = 0.0
    other_tenants_window_usd: float = 0.0  # the part of the devices the deployment does not use
    other_tenants_monthly_usd: float = 0.0


@dataclass(frozen=True)
class Tco:
    gpu_type: str
    gpu_hour_usd: float
    prices_as_of: str
    monthly_output_tokens: float
    volume_source: str  # observed | given
    arms: tuple[ArmCost, ...]
    benefits: tuple[Benefit, ...]
    primary: str | None  # key of the speculative arm that served the most tokens
    notes: tuple[str, ...]
    pricing: str = "on-demand"
    idle: IdleCost | None = None
    assumptions: tuple[Assumption, ...] = ()
    allocation: Allocation | None = None  # the window's bill and its lines (Σ lines = Σ bills)


def _uses(arm: ModeMeasure, inputs: CostInputs) -> list[tuple[InstanceUse, ArmUse]]:
    return [(i, u) for i in inputs.usage for u in i.arms if u.arm == arm.key]


def memory_share(arm: ModeMeasure, inputs: CostInputs) -> float:
    """The deployment's share of the devices the arm ran on, weighted by its device time (1.0: whole)."""
    uses = [(i.share, u.device_s) for i, u in _uses(arm, inputs)]
    seconds = sum(d for _, d in uses)
    return sum(s * d for s, d in uses) / seconds if seconds > 0 else 1.0


def arm_gpu_count(arm: ModeMeasure, inputs: CostInputs) -> float:
    """GPUs per instance the arm ran on, weighted by its ok device time (the inputs' when it ran on none)."""
    uses = _uses(arm, inputs)
    seconds = sum(u.device_s for _, u in uses)
    if seconds <= 0:
        return float(inputs.gpu_count)
    return sum((inputs.device(i.name).gpu_count or 1) * u.device_s for i, u in uses) / seconds


def energy_weights(arm: ModeMeasure, inputs: CostInputs) -> list[tuple[str, float]]:
    """(instance, share x the energy of the arm's ok work there): how its energy is charged."""
    return [(i.name, i.share * (u.energy_j or 0.0)) for i, u in _uses(arm, inputs)]


def energy_added_part(arm: ModeMeasure, inputs: CostInputs) -> float:
    """The part of the arm's charged energy on instances that pay for power (on-prem), 0 to 1; with no
    energy charged anywhere, whether the inputs' pricing adds it."""
    weights = energy_weights(arm, inputs)
    total = sum(w for _, w in weights)
    if total <= 0:
        return float(inputs.energy_added)
    return sum(w for name, w in weights if inputs.device(name).energy_added) / total


@dataclass(frozen=True)
class _Rates:
    """An arm's $ per ok device-second by line kind, and its energy's share, from the allocation."""

    compute: float
    retries: float
    idle: float
    energy_share: float
    window_usd: float
    estimate: bool


def _rates(arm: ModeMeasure, inputs: CostInputs, allocation: Allocation) -> _Rates:
    uses = _uses(arm, inputs)
    seconds = sum(u.device_s for _, u in uses)
    joules = sum(u.energy_j or 0.0 for _, u in uses)
    lines = [line for line in allocation.lines if line.arm == arm.key]
    spent = {kind: sum(line.usd for line in lines if line.kind == kind) for kind in ("retries", "idle")}
    compute = sum(line.compute_usd for line in lines if line.kind == "arm")
    per_s = (lambda usd: usd / seconds) if seconds > 0 else (lambda usd: 0.0)
    share = sum(i.share * (u.energy_j or 0.0) for i, u in uses) / joules if joules > 0 else memory_share(arm, inputs)
    window = sum(line.usd for line in lines)
    return _Rates(
        per_s(compute), per_s(spent["retries"]), per_s(spent["idle"]), share, window, any(u.derived for _, u in uses)
    )


def arm_cost(arm: ModeMeasure, inputs: CostInputs, volume: float, allocation: Allocation | None = None) -> ArmCost:
    """The per-1M-token breakdown of the module docstring, and its monthly cost at `volume` tokens."""
    rates = _rates(arm, inputs, allocation or allocate(inputs))
    device_s = MTOK / arm.tokens_per_s
    compute = device_s * rates.compute
    kwh = None if arm.energy_j_per_token is None else arm.energy_j_per_token * MTOK / J_PER_KWH
    energy = (
        0.0 if kwh is None else kwh * inputs.prices.pue * inputs.prices.electricity_usd_per_kwh * rates.energy_share
    )
    added = energy_added_part(arm, inputs)
    retries, idle = device_s * rates.retries, device_s * rates.idle
    total = compute + energy * added + retries + idle
    return ArmCost(
        arm.key,
        arm.mode,
        arm.drafter,
        memory_share(arm, inputs),
        arm.memory_source,
        arm_gpu_count(arm, inputs) * device_s / 3600,
        compute,
        kwh,
        energy,
        arm.energy_source if kwh is not None else None,
        added > 0,
        arm.retry_factor,
        retries,
        idle,
        total,
        total * volume / MTOK,
        arm.device_s_source,
        rates.window_usd,
        rates.estimate,
    )


def _month_scale(inputs: CostInputs, allocation: Allocation) -> float:
    """Window $ -> monthly $ at the volume priced: volume / the window's ok tokens (observed volume:
    a month over the window)."""
    tokens = sum(line.output_tokens for line in allocation.lines)
    volume = monthly_volume(inputs)[0]
    if tokens > 0:
        return volume / tokens
    return SECONDS_PER_MONTH / inputs.window_s if inputs.window_s > 0 else 0.0


def idle_cost(inputs: CostInputs, allocation: Allocation | None = None) -> IdleCost | None:
    """Idle instance time and the other tenants' part, in the window and per month; None without up-time."""
    allocation = allocation or allocate(inputs)
    sampled = [i for i in inputs.usage if i.up_s is not None]
    if not sampled or sum(i.billed_s for i in sampled) <= 0:
        return None
    up, idle_s = sum(i.billed_s for i in sampled), sum(i.idle_s for i in sampled)
    scale = _month_scale(inputs, allocation)
    idle_usd = allocation.usd(kind="idle")
    others = allocation.usd(kind="other_tenants")
    joules = [i.idle_energy_j for i in sampled]
    kwh = None if any(j is None for j in joules) else sum(joules) / J_PER_KWH * scale
    return IdleCost(
        up, idle_s, idle_s / up, idle_usd * scale, kwh, inputs.idle_allocation, idle_usd, others, others * scale
    )


def benefit(spec: ArmCost, plain: ArmCost, inputs: CostInputs) -> Benefit:
    """Net monthly benefit and payback of one speculative arm against plain decoding (see `Benefit`)."""
    measure = next(arm for arm in inputs.arms if arm.key == spec.key)
    device = spec.monthly_usd * draft_fraction(measure)
    hidden = hidden_monthly(
        inputs.hidden,
        inputs.prices,
        spec.drafter,
        spec.monthly_usd,
        draft_device=device,
        draft_memory=draft_memory_monthly(measure, inputs),
    )
    saving = plain.monthly_usd - spec.monthly_usd
    run = training_run_usd(inputs.hidden, spec.drafter)
    recurring = hidden.total_usd - hidden.draft_training_usd * (1 + inputs.hidden.tech_debt_buffer)
    payback = run / (saving - recurring) if saving > recurring else None
    estimated = estimated_from(inputs, spec.key)
    net = saving - hidden.total_usd
    return Benefit(spec.key, spec.drafter, saving, hidden, net, payback, estimated, net + hidden.tech_debt_usd)


def tco(inputs: CostInputs) -> Tco:
    """Every arm's cost, the idle line, the window's allocation, and every speculative arm's benefit."""
    volume, volume_source = monthly_volume(inputs)
    allocation = allocate(inputs)
    costs = tuple(arm_cost(arm, inputs, volume, allocation) for arm in inputs.arms)
    plain = next((c for c in costs if c.mode == "autoregressive"), None)
    benefits = tuple(benefit(c, plain, inputs) for c in costs if c.mode == "speculative") if plain else ()
    return Tco(
        inputs.gpu_type,
        inputs.gpu_hour_usd,
        inputs.prices.as_of,
        volume,
        volume_source,
        costs,
        benefits,
        primary_key(inputs),
        notes(inputs),
        inputs.pricing,
        idle_cost(inputs, allocation),
        assumptions(inputs),
        allocation,
    )


def primary_key(inputs: CostInputs) -> str | None:
    """The speculative arm that served the most output tokens (what is actually in use)."""
    spec = inputs.speculative_arms
    return max(spec, key=lambda arm: arm.output_tokens).key if spec else None


def net_benefit(inputs: CostInputs, key: str | None = None) -> float | None:
    """Net monthly benefit (USD) of arm `key` (default: the primary one); None without a plain arm."""
    key = key or primary_key(inputs)
    found = next((b for b in tco(inputs).benefits if b.key == key), None)
    return None if found is None else found.net_usd
