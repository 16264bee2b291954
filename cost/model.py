"""The cost model (TCO) of speculative decoding: pure functions over one frozen `CostInputs`.

No I/O here: `cost.inputs` builds the inputs (from the store, a TOML file or the
shipped price table), `cost.breakeven` asks when speculation stops paying.

Every dollar comes from one allocation (`cost.allocation.allocate`): each instance's bill split into
arm, retries, idle and other-tenant lines that add up to it. Per arm (a mode and drafter:
"autoregressive", "speculative:ngram", ...), per 1M output tokens, with rates per ok device-second
taken from the arm's lines (so at the measured throughput the figures are the lines themselves):

    gpu_hours_per_mtok = gpu_count x 1e6 / tokens_per_s / 3600                           [GPU h]
    compute_usd        = 1e6 / tokens_per_s x (arm lines' compute $ / ok device_s)       [$]
                         (= gpu_hours_per_mtok x $/GPU-hour x memory_share)
    energy_kwh         = energy_j_per_token x 1e6 / 3.6e6 (ok work only)                 [kWh]
    energy_usd         = energy_kwh x PUE x $/kWh x share: added on-prem only (a cloud GPU-hour
                         price already pays for power: shown for information)
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

from cost.allocation import Allocation, allocate
from cost.assumptions import assumptions
from cost.terms import (
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
    Assumption,
    CostInputs,
    HiddenCosts,
    IdleTime,
    ModeMeasure,
    Prices,
    monthly_volume,
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
    energy_added: bool  # False: shown for information (a cloud price already pays for power)
    retry_factor: float
    retries_usd_per_mtok: float
    idle_usd_per_mtok: float  # idle time charged to the arm (0 when idle is its own line)
    total_usd_per_mtok: float
    monthly_usd: float
    device_s_source: str
    window_usd: float = 0.0  # the arm's lines in the window: its work, its retries, the idle charged to it
    estimate: bool = False  # part of its device time derived from request times: shown with "~"


@dataclass(frozen=True)
class HiddenMonthly:
    """Hidden monthly costs of speculation with one drafter (USD/month).

    The reserve (tech_debt_usd) is tech_debt_buffer x reserve_base_usd; with reserve_base "additions"
    that base is what speculation adds (the drafter's device time and memory, training, operations,
    storage), with "deployment" the speculative deployment's whole cost. The drafter's device time is
    already in the arm's serving cost and its memory in the instance's share: they are in the base,
    not added again."""

    draft_training_usd: float
    monitoring_usd: float
    monitoring_source: str
    incidents_usd: float
    incidents_source: str
    opportunity_usd: float
    tech_debt_usd: float
    total_usd: float
    draft_device_usd: float = 0.0  # the drafter's share of the arm's monthly device cost (draft_s / device_s)
    draft_memory_usd: float = 0.0  # the draft's memory share of the instances' month
    reserve_base: str = "additions"
    reserve_base_usd: float = 0.0


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


def memory_share(arm: ModeMeasure, inputs: CostInputs) -> float:
    """The deployment's share of the devices the arm ran on, weighted by its device time (1.0: whole)."""
    uses = [(i.share, u.device_s) for i in inputs.usage for u in i.arms if u.arm == arm.key]
    seconds = sum(d for _, d in uses)
    return sum(s * d for s, d in uses) / seconds if seconds > 0 else 1.0


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
    uses = [(i, u) for i in inputs.usage for u in i.arms if u.arm == arm.key]
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
    charged_energy = energy if inputs.energy_added else 0.0
    retries, idle = device_s * rates.retries, device_s * rates.idle
    total = compute + charged_energy + retries + idle
    return ArmCost(
        arm.key,
        arm.mode,
        arm.drafter,
        memory_share(arm, inputs),
        arm.memory_source,
        inputs.gpu_count * device_s / 3600,
        compute,
        kwh,
        energy,
        arm.energy_source if kwh is not None else None,
        inputs.energy_added,
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


def needs_training(drafter: str | None) -> bool:
    """A drafter with trained weights of the team's own (see UNTRAINED_DRAFTERS)."""
    if drafter is None or drafter in UNTRAINED_DRAFTERS:
        return False
    return not drafter.startswith(UNTRAINED_PREFIXES)


def draft_fraction(arm: ModeMeasure) -> float:
    """The share of the arm's device time spent drafting: draft_s / device_s (engine records), else
    draft_s / (draft_s + verify_s) when only the timings are known; 0 when not measured."""
    if arm.device_s > 0:
        return min(arm.draft_s / arm.device_s, 1.0)
    timed = arm.draft_s + arm.verify_s
    return arm.draft_s / timed if timed > 0 else 0.0


def draft_memory_monthly(arm: ModeMeasure, inputs: CostInputs) -> float:
    """The draft's memory share of every instance it held memory on, for a month."""
    fraction = arm.draft_memory_bytes / (inputs.gpu_count * inputs.device_memory_bytes)
    instances = max(sum(any(u.arm == arm.key for u in i.arms) for i in inputs.usage), 1)
    return min(fraction, 1.0) * instances * inputs.gpu_count * inputs.gpu_hour_usd * SECONDS_PER_MONTH / 3600


def hidden_monthly(
    hidden: HiddenCosts,
    prices: Prices,
    drafter: str | None,
    spec_monthly_usd: float,
    adds: float = 0.0,
    draft_device: float = 0.0,
    draft_memory: float = 0.0,
) -> HiddenMonthly:
    """USD/month:
    draft_training = draft_training_usd x (training_data_fraction / 0.10) / amortisation_months
                     (0 for an untrained drafter; the seed's run is at 10% of the target's data)
    monitoring     = monitoring_gb_per_day x retention_days x storage_usd_per_gb_month
                     (the steady-state store size, paid every month)
    incidents      = incident_days_per_week x 52/12 x engineer_day_usd
    opportunity    = opportunity_days_per_month x engineer_day_usd
    tech_debt      = tech_debt_buffer x base: "additions" = the drafter's device time and memory
                     (draft_device, draft_memory) + all of the above; "deployment" = the speculative
                     arm's monthly serving cost + all of the above"""
    training = training_run_usd(hidden, drafter) / hidden.amortisation_months
    monitoring = hidden.monitoring_gb_per_day * hidden.monitoring_retention_days * prices.storage_usd_per_gb_month
    incidents = hidden.incident_days_per_week * WEEKS_PER_MONTH * prices.engineer_day_usd
    opportunity = hidden.opportunity_days_per_month * prices.engineer_day_usd
    others = training + monitoring + incidents + opportunity
    base = others + (draft_device + draft_memory if hidden.reserve_base == "additions" else spec_monthly_usd)
    buffer = hidden.tech_debt_buffer * base
    return HiddenMonthly(
        training,
        monitoring,
        hidden.monitoring_source,
        incidents,
        hidden.source("incident_days_per_week"),
        opportunity,
        buffer,
        others + buffer,
        draft_device,
        draft_memory,
        hidden.reserve_base,
        base,
    )


def training_run_usd(hidden: HiddenCosts, drafter: str | None) -> float:
    """One training run of the drafter (0 when it has no trained weights)."""
    return hidden.draft_training_usd * hidden.training_data_fraction / 0.10 if needs_training(drafter) else 0.0


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


def estimated_from(inputs: CostInputs, key: str) -> tuple[str, ...]:
    """Inputs behind arm `key`'s net benefit that are estimates or seed defaults (see `Benefit`)."""
    found = []
    arms = [arm for arm in inputs.arms if arm.key == key or arm.mode == "autoregressive"]
    for arm in arms:
        if inputs.energy_added and arm.energy_source and "estimate" in arm.energy_source:
            found.append(f"{arm.key} energy (estimate)")
        if arm.memory_source not in ("measured", "given"):
            found.append(f"{arm.key} memory ({arm.memory_source})")
        if arm.device_s_source == "derived":
            found.append(f"{arm.key} device time (processor sharing derived from request times)")
    spec = next((arm for arm in arms if arm.key == key), None)
    for name in HIDDEN_FIELDS:
        if name in ("draft_training_usd", "training_data_fraction", "amortisation_months") and not (
            spec and needs_training(spec.drafter)
        ):
            continue
        if inputs.hidden.source(name) == SEED and (name != "opportunity_days_per_month"):
            found.append(f"{name} (seed default)")
    return tuple(found)


def primary_key(inputs: CostInputs) -> str | None:
    """The speculative arm that served the most output tokens (what is actually in use)."""
    spec = inputs.speculative_arms
    return max(spec, key=lambda arm: arm.output_tokens).key if spec else None


def net_benefit(inputs: CostInputs, key: str | None = None) -> float | None:
    """Net monthly benefit (USD) of arm `key` (default: the primary one); None without a plain arm."""
    key = key or primary_key(inputs)
    found = next((b for b in tco(inputs).benefits if b.key == key), None)
    return None if found is None else found.net_usd


def notes(inputs: CostInputs) -> tuple[str, ...]:
    """What the figures leave out or estimate, in words."""
    found = []
    if inputs.baseline is None:
        found.append("no autoregressive arm measured: no benefit of speculation can be computed")
    if not inputs.energy_added:
        found.append(f"{inputs.pricing} pricing: the GPU-hour price includes power; energy is shown, not added")
    for arm in inputs.arms:
        if arm.energy_source is None or arm.energy_j_per_token is None:
            found.append(f"{arm.key}: energy not measured" + (", counted as $0" if inputs.energy_added else ""))
        elif "estimate" in arm.energy_source:
            found.append(f"{arm.key}: energy is an estimate (CPU-seconds x watts per busy core, not metered)")
        if arm.memory_source not in ("measured", "given"):
            found.append(
                f"{arm.key}: memory {arm.memory_source}"
                + (" (whole devices charged)" if arm.target_memory_bytes is None else "")
            )
        if arm.device_s_source == "derived":
            found.append(f"{arm.key}: device time derived by processor sharing over request times (no device_s)")
    if inputs.idle is None:
        found.append("idle time not measured (no device samples): only busy device time is priced")
    if inputs.hidden.monitoring_source == SEED:
        found.append(
            f"monitoring storage: {inputs.hidden.monitoring_gb_per_day:g} GB/day assumed (seed default), not measured"
        )
    if inputs.hidden.opportunity_days_per_month == 0:
        found.append("opportunity cost (iteration slowdown, learning curve) not counted: 0 engineer-days assumed")
    return tuple(found)
