"""The cost model (TCO) of speculative decoding: pure functions over one frozen `CostInputs`.

No I/O here: `cost.inputs` builds the inputs (from the store, a TOML file or the
shipped price table), `cost.breakeven` asks when speculation stops paying.

Per arm (a mode and drafter: "autoregressive", "speculative:ngram", ...), per 1M output tokens:

    memory_share       = (target + draft bytes held) / (gpu_count x gpu_memory_bytes)   [-]
                         (1.0, the whole device, when memory was not measured)
    gpu_hours_per_mtok = gpu_count x 1e6 / tokens_per_s / 3600                          [GPU h]
    compute_usd        = gpu_hours_per_mtok x gpu_hour_usd x memory_share               [$]
    energy_kwh         = energy_j_per_token x 1e6 / 3.6e6                               [kWh]
    energy_usd         = energy_kwh x pue x electricity_usd_per_kwh                     [$]
                         added on-prem only: a cloud GPU-hour price already pays for power,
                         so there it is shown for information
    retry_factor       = device time of requests that did not finish ok / that of those that did
                         (what-if inputs without device time: retries / requests)  [-]
    retries_usd        = (compute_usd + energy_usd added) x retry_factor                [$]
    total_usd          = compute_usd + energy_usd added + retries_usd                   [$ / 1M tokens]

`tokens_per_s` is output tokens per second of *device time attributed to the arm*: Σ ok
tokens / Σ `device_s` of its ok requests. Under concurrency every request is charged only
its share of each batched forward (engine) or of each interval (processor sharing), so an
instance serving 8 requests at once is priced by what it really serves, and speculation's
extra verify rows are charged to it. Device time nobody used (instance up-time minus Σ
device_s) is the idle line: shown on its own, or spread over the arms by their device time
(`idle_allocation`), never hidden in a per-token figure.

Memory share charges an arm for the part of the device it occupies (the rest can serve
other work), so a draft costs twice: its memory, and nothing else unless it speeds decoding
up.

Per month, the whole volume V served one way: `monthly_usd = total_usd x V / 1e6`. Hidden
monthly costs of running speculation (see `hidden_monthly`) are subtracted from what it
saves against plain decoding (`benefits`); each input's value and source are listed by
`assumptions`.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    memory_share: float
    memory_source: str
    gpu_hours_per_mtok: float
    compute_usd_per_mtok: float
    energy_kwh_per_mtok: float | None
    energy_usd_per_mtok: float  # 0 when energy was not measured (energy_source None)
    energy_source: str | None
    energy_added: bool  # False: shown for information (a cloud price already pays for power)
    retry_factor: float
    retries_usd_per_mtok: float
    idle_usd_per_mtok: float  # idle device time spread by share (0 when shown as its own line)
    total_usd_per_mtok: float
    monthly_usd: float
    device_s_source: str


@dataclass(frozen=True)
class HiddenMonthly:
    """Hidden monthly costs of speculation with one drafter (USD/month)."""

    draft_training_usd: float
    monitoring_usd: float
    monitoring_source: str
    incidents_usd: float
    incidents_source: str
    opportunity_usd: float
    tech_debt_usd: float
    total_usd: float


@dataclass(frozen=True)
class Benefit:
    """Speculation with one drafter against plain decoding, per month (USD).

    explicit_saving_usd = plain monthly_usd - speculative monthly_usd
    net_usd             = explicit_saving_usd - hidden.total_usd
    payback_months      = draft training / (explicit saving - recurring hidden costs incl. buffer),
                          None when that saving is <= 0 (the training never pays back).
    estimated_from      = the inputs behind net_usd that are estimates or seed defaults, not measured
                          or given (empty: every input was)."""

    key: str
    drafter: str | None
    explicit_saving_usd: float
    hidden: HiddenMonthly
    net_usd: float
    payback_months: float | None
    estimated_from: tuple[str, ...] = ()


@dataclass(frozen=True)
class IdleCost:
    """Instance time no request used, per month at the observed rate (shown, or spread by share)."""

    up_s: float
    idle_s: float
    idle_fraction: float
    monthly_usd: float
    energy_kwh_per_month: float | None
    allocation: str


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


def memory_share(arm: ModeMeasure, inputs: CostInputs) -> float:
    """Share of the instance's device memory the arm holds; 1.0 (whole devices) when unmeasured."""
    if arm.target_memory_bytes is None:
        return 1.0
    return (arm.target_memory_bytes + arm.draft_memory_bytes) / (inputs.gpu_count * inputs.device_memory_bytes)


def arm_cost(arm: ModeMeasure, inputs: CostInputs, volume: float) -> ArmCost:
    """The per-1M-token breakdown of the module docstring, and its monthly cost at `volume` tokens."""
    share = memory_share(arm, inputs)
    gpu_hours = inputs.gpu_count * MTOK / arm.tokens_per_s / 3600
    compute = gpu_hours * inputs.gpu_hour_usd * share
    kwh = None if arm.energy_j_per_token is None else arm.energy_j_per_token * MTOK / J_PER_KWH
    energy = 0.0 if kwh is None else kwh * inputs.prices.pue * inputs.prices.electricity_usd_per_kwh
    charged_energy = energy if inputs.energy_added else 0.0
    retries = (compute + charged_energy) * arm.retry_factor
    idle = compute * inputs.idle_factor
    total = compute + charged_energy + retries + idle
    return ArmCost(
        arm.key,
        arm.mode,
        arm.drafter,
        share,
        arm.memory_source,
        gpu_hours,
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
    )


def idle_cost(inputs: CostInputs) -> IdleCost | None:
    """Idle instance time per month at the window's rate; None when up-time was not measured."""
    idle, window_s = inputs.idle, inputs.window_s
    if idle is None or idle.up_s <= 0 or window_s <= 0:
        return None
    per_month = SECONDS_PER_MONTH / window_s
    usd = idle.idle_s / 3600 * inputs.gpu_count * inputs.gpu_hour_usd * per_month
    kwh = None if idle.energy_j is None else idle.energy_j / J_PER_KWH * per_month
    if kwh is not None and inputs.energy_added:
        usd += kwh * inputs.prices.pue * inputs.prices.electricity_usd_per_kwh
    return IdleCost(idle.up_s, idle.idle_s, idle.idle_s / idle.up_s, usd, kwh, inputs.idle_allocation)


def needs_training(drafter: str | None) -> bool:
    """A drafter with trained weights of the team's own (see UNTRAINED_DRAFTERS)."""
    if drafter is None or drafter in UNTRAINED_DRAFTERS:
        return False
    return not drafter.startswith(UNTRAINED_PREFIXES)


def hidden_monthly(hidden: HiddenCosts, prices: Prices, drafter: str | None, spec_monthly_usd: float) -> HiddenMonthly:
    """USD/month:
    draft_training = draft_training_usd x (training_data_fraction / 0.10) / amortisation_months
                     (0 for an untrained drafter; the seed's run is at 10% of the target's data)
    monitoring     = monitoring_gb_per_day x retention_days x storage_usd_per_gb_month
                     (the steady-state store size, paid every month)
    incidents      = incident_days_per_week x 52/12 x engineer_day_usd
    opportunity    = opportunity_days_per_month x engineer_day_usd
    tech_debt      = tech_debt_buffer x (the speculative arm's monthly serving cost + all of the above):
                     the seed's reserve on top of the speculative deployment's costs"""
    training = training_run_usd(hidden, drafter) / hidden.amortisation_months
    monitoring = hidden.monitoring_gb_per_day * hidden.monitoring_retention_days * prices.storage_usd_per_gb_month
    incidents = hidden.incident_days_per_week * WEEKS_PER_MONTH * prices.engineer_day_usd
    opportunity = hidden.opportunity_days_per_month * prices.engineer_day_usd
    others = training + monitoring + incidents + opportunity
    buffer = hidden.tech_debt_buffer * (spec_monthly_usd + others)
    return HiddenMonthly(
        training,
        monitoring,
        hidden.monitoring_source,
        incidents,
        hidden.source("incident_days_per_week"),
        opportunity,
        buffer,
        others + buffer,
    )


def training_run_usd(hidden: HiddenCosts, drafter: str | None) -> float:
    """One training run of the drafter (0 when it has no trained weights)."""
    return hidden.draft_training_usd * hidden.training_data_fraction / 0.10 if needs_training(drafter) else 0.0


def benefit(spec: ArmCost, plain: ArmCost, inputs: CostInputs) -> Benefit:
    """Net monthly benefit and payback of one speculative arm against plain decoding (see `Benefit`)."""
    hidden = hidden_monthly(inputs.hidden, inputs.prices, spec.drafter, spec.monthly_usd)
    saving = plain.monthly_usd - spec.monthly_usd
    run = training_run_usd(inputs.hidden, spec.drafter)
    recurring = hidden.total_usd - hidden.draft_training_usd * (1 + inputs.hidden.tech_debt_buffer)
    payback = run / (saving - recurring) if saving > recurring else None
    estimated = estimated_from(inputs, spec.key)
    return Benefit(spec.key, spec.drafter, saving, hidden, saving - hidden.total_usd, payback, estimated)


def tco(inputs: CostInputs) -> Tco:
    """Every arm's cost, the idle line, and every speculative arm's benefit over the autoregressive one."""
    volume, volume_source = monthly_volume(inputs)
    costs = tuple(arm_cost(arm, inputs, volume) for arm in inputs.arms)
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
        idle_cost(inputs),
        assumptions(inputs),
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
