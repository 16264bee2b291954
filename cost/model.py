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
    retry_factor       = retries / requests                                             [attempts]
    retries_usd        = (compute_usd + energy_usd) x retry_factor                      [$]
    total_usd          = compute_usd + energy_usd + retries_usd                         [$ / 1M tokens]

Memory share charges an arm for the part of the device it occupies (the rest can serve
other work), so a draft costs twice: its memory, and nothing else unless it speeds decoding
up. `tokens_per_s` is output tokens per second of one instance while it serves requests
(batch 1: the engine's measured per-request decode speed).

Per month, the whole volume V served one way: `monthly_usd = total_usd x V / 1e6`. Hidden
monthly costs of running speculation (see `hidden_monthly`) are subtracted from what it
saves against plain decoding (`benefits`).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

SECONDS_PER_MONTH = 730 * 3600  # 365 x 24 / 12 hours
DAYS_PER_MONTH = 365 / 12
WEEKS_PER_MONTH = 52 / 12
J_PER_KWH = 3.6e6
MTOK = 1e6
GB = 1e9
MODES = ("speculative", "autoregressive")
# Drafters without trained weights: prompt lookup and suffix decoding need no training run.
UNTRAINED_DRAFTERS = ("ngram", "suffix")


@dataclass(frozen=True)
class Accelerator:
    name: str
    usd_per_hour: float
    memory_gb: float
    source: str = ""


@dataclass(frozen=True)
class Prices:
    """Prices from a dated table (`cost/prices.toml`); all in USD."""

    accelerators: dict[str, Accelerator]
    electricity_usd_per_kwh: float = 0.12
    pue: float = 1.3
    storage_usd_per_gb_month: float = 0.08
    engineer_day_usd: float = 800.0
    as_of: str = ""

    def __post_init__(self) -> None:
        _require(self.pue >= 1.0, "pue must be >= 1 (facility energy / IT energy)")
        for name in ("electricity_usd_per_kwh", "storage_usd_per_gb_month", "engineer_day_usd"):
            _require(getattr(self, name) >= 0, f"{name} must be >= 0")
        for gpu in self.accelerators.values():
            _require(gpu.usd_per_hour >= 0 and gpu.memory_gb > 0, f"accelerator {gpu.name}: price >= 0, memory > 0")

    def accelerator(self, gpu_type: str) -> Accelerator:
        if gpu_type not in self.accelerators:
            raise ValueError(
                f"unknown GPU type {gpu_type!r}; the price table has {', '.join(sorted(self.accelerators))}"
            )
        return self.accelerators[gpu_type]

    def with_gpu_hour(self, gpu_type: str, usd_per_hour: float) -> Prices:
        gpu = replace(self.accelerator(gpu_type), usd_per_hour=usd_per_hour, source="given")
        return replace(self, accelerators={**self.accelerators, gpu_type: gpu})


@dataclass(frozen=True)
class HiddenCosts:
    """Costs of running speculation that no per-token figure shows (defaults: the issue's seed figures).

    monitoring_source: "default" (the seed 15 GB/day), "measured" (the store's growth) or "given"."""

    draft_training_usd: float = 15_000.0  # a 7B-class draft on a p4d.24xlarge
    amortisation_months: float = 12.0
    monitoring_gb_per_day: float = 15.0
    monitoring_source: str = "default"
    monitoring_retention_days: float = 30.0
    incident_days_per_week: float = 2.0  # person-days of incident handling
    tech_debt_buffer: float = 0.20  # fraction added on top of the other hidden costs

    def __post_init__(self) -> None:
        _require(self.amortisation_months > 0, "amortisation_months must be > 0")
        _require(0 <= self.tech_debt_buffer <= 10, "tech_debt_buffer must be a fraction in [0, 10]")
        for name in (
            "draft_training_usd",
            "monitoring_gb_per_day",
            "monitoring_retention_days",
            "incident_days_per_week",
        ):
            _require(getattr(self, name) >= 0, f"{name} must be >= 0")


@dataclass(frozen=True)
class ModeMeasure:
    """Measured aggregates of one arm (mode, drafter) over `window_s` seconds.

    tokens_per_s: output tokens per second while serving (per instance of `gpu_count` GPUs).
    target/draft_memory_bytes: device memory held (None: not measured; memory_source says how
    it was obtained). drafts..verify_s: raw counters for the break-even analysis."""

    mode: str
    drafter: str | None
    requests: int
    output_tokens: int
    window_s: float
    tokens_per_s: float
    energy_j_per_token: float | None = None
    energy_source: str | None = None  # nvml | rapl | estimate | comma-joined mix | None (unmeasured)
    retries: int = 0
    target_memory_bytes: float | None = None
    draft_memory_bytes: float = 0.0
    memory_source: str = "unmeasured"
    drafts: int = 0
    draft_tokens: int = 0
    accepted_tokens: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0

    def __post_init__(self) -> None:
        _require(self.mode in MODES, f"mode must be one of {MODES}")
        _require(self.tokens_per_s > 0, f"{self.key}: tokens_per_s must be > 0")
        _require(self.window_s > 0, f"{self.key}: window_s must be > 0")
        for name in (
            "requests",
            "output_tokens",
            "retries",
            "draft_memory_bytes",
            "drafts",
            "draft_tokens",
            "accepted_tokens",
            "draft_s",
            "verify_s",
        ):
            _require(getattr(self, name) >= 0, f"{self.key}: {name} must be >= 0")
        _require(self.energy_j_per_token is None or self.energy_j_per_token >= 0, f"{self.key}: energy must be >= 0")
        _require(self.target_memory_bytes is None or self.target_memory_bytes >= 0, f"{self.key}: memory must be >= 0")

    @property
    def key(self) -> str:
        return self.mode if self.drafter is None else f"{self.mode}:{self.drafter}"

    @property
    def mean_acceptance_length(self) -> float | None:
        """1 + accepted / drafts: tokens emitted per target forward while drafting."""
        return 1.0 + self.accepted_tokens / self.drafts if self.drafts else None

    @property
    def mean_draft_length(self) -> float | None:
        """Drafted tokens per draft: the effective lookahead gamma."""
        return self.draft_tokens / self.drafts if self.drafts else None


@dataclass(frozen=True)
class CostInputs:
    """Everything the cost model reads. gpu_memory_bytes None: the price table's figure;
    monthly_output_tokens None: the volume observed over the arms' window."""

    arms: tuple[ModeMeasure, ...]
    prices: Prices
    gpu_type: str
    gpu_count: int = 1
    gpu_memory_bytes: float | None = None
    monthly_output_tokens: float | None = None
    hidden: HiddenCosts = field(default_factory=HiddenCosts)

    def __post_init__(self) -> None:
        self.prices.accelerator(self.gpu_type)
        _require(self.gpu_count >= 1, "gpu_count must be >= 1")
        _require(self.gpu_memory_bytes is None or self.gpu_memory_bytes > 0, "gpu_memory_bytes must be > 0")
        _require(
            self.monthly_output_tokens is None or self.monthly_output_tokens >= 0, "monthly_output_tokens must be >= 0"
        )
        keys = [arm.key for arm in self.arms]
        _require(len(set(keys)) == len(keys), "one measure per (mode, drafter)")
        _require(sum(arm.mode == "autoregressive" for arm in self.arms) <= 1, "at most one autoregressive arm")

    @property
    def gpu_hour_usd(self) -> float:
        return self.prices.accelerator(self.gpu_type).usd_per_hour

    @property
    def device_memory_bytes(self) -> float:
        """Memory of one device: given, else the price table's."""
        return self.gpu_memory_bytes or self.prices.accelerator(self.gpu_type).memory_gb * GB

    @property
    def baseline(self) -> ModeMeasure | None:
        return next((arm for arm in self.arms if arm.mode == "autoregressive"), None)

    @property
    def speculative_arms(self) -> tuple[ModeMeasure, ...]:
        return tuple(arm for arm in self.arms if arm.mode == "speculative")


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
    retry_factor: float
    retries_usd_per_mtok: float
    total_usd_per_mtok: float
    monthly_usd: float


@dataclass(frozen=True)
class HiddenMonthly:
    """Hidden monthly costs of speculation with one drafter (USD/month)."""

    draft_training_usd: float
    monitoring_usd: float
    monitoring_source: str
    incidents_usd: float
    tech_debt_usd: float
    total_usd: float


@dataclass(frozen=True)
class Benefit:
    """Speculation with one drafter against plain decoding, per month (USD).

    explicit_saving_usd = plain monthly_usd - speculative monthly_usd
    net_usd             = explicit_saving_usd - hidden.total_usd
    payback_months      = draft training / (explicit saving - recurring hidden costs incl. buffer),
                          None when that saving is <= 0 (the training never pays back)."""

    key: str
    drafter: str | None
    explicit_saving_usd: float
    hidden: HiddenMonthly
    net_usd: float
    payback_months: float | None


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


def monthly_volume(inputs: CostInputs) -> tuple[float, str]:
    """Output tokens per month: given, else observed = tokens / window_s x SECONDS_PER_MONTH."""
    if inputs.monthly_output_tokens is not None:
        return inputs.monthly_output_tokens, "given"
    if not inputs.arms:
        return 0.0, "observed"
    window_s = max(arm.window_s for arm in inputs.arms)
    return sum(arm.output_tokens for arm in inputs.arms) / window_s * SECONDS_PER_MONTH, "observed"


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
    retry_factor = arm.retries / arm.requests if arm.requests else 0.0
    retries = (compute + energy) * retry_factor
    total = compute + energy + retries
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
        retry_factor,
        retries,
        total,
        total * volume / MTOK,
    )


def needs_training(drafter: str | None) -> bool:
    return drafter is not None and drafter not in UNTRAINED_DRAFTERS


def hidden_monthly(hidden: HiddenCosts, prices: Prices, drafter: str | None) -> HiddenMonthly:
    """USD/month:
    draft_training = draft_training_usd / amortisation_months   (0 for n-gram drafters)
    monitoring     = monitoring_gb_per_day x retention_days x storage_usd_per_gb_month
                     (the steady-state store size, paid every month)
    incidents      = incident_days_per_week x 52/12 x engineer_day_usd
    tech_debt      = tech_debt_buffer x (draft_training + monitoring + incidents)"""
    training = hidden.draft_training_usd / hidden.amortisation_months if needs_training(drafter) else 0.0
    monitoring = hidden.monitoring_gb_per_day * hidden.monitoring_retention_days * prices.storage_usd_per_gb_month
    incidents = hidden.incident_days_per_week * WEEKS_PER_MONTH * prices.engineer_day_usd
    buffer = hidden.tech_debt_buffer * (training + monitoring + incidents)
    return HiddenMonthly(
        training, monitoring, hidden.monitoring_source, incidents, buffer, training + monitoring + incidents + buffer
    )


def benefit(spec: ArmCost, plain: ArmCost, inputs: CostInputs) -> Benefit:
    """Net monthly benefit and payback of one speculative arm against plain decoding (see `Benefit`)."""
    hidden = hidden_monthly(inputs.hidden, inputs.prices, spec.drafter)
    saving = plain.monthly_usd - spec.monthly_usd
    recurring = (hidden.monitoring_usd + hidden.incidents_usd) * (1 + inputs.hidden.tech_debt_buffer)
    training = inputs.hidden.draft_training_usd if needs_training(spec.drafter) else 0.0
    payback = training / (saving - recurring) if saving > recurring else None
    return Benefit(spec.key, spec.drafter, saving, hidden, saving - hidden.total_usd, payback)


def tco(inputs: CostInputs) -> Tco:
    """Every arm's cost, and every speculative arm's benefit over the autoregressive one."""
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


def notes(inputs: CostInputs) -> tuple[str, ...]:
    """What the figures leave out or estimate, in words."""
    found = []
    if inputs.baseline is None:
        found.append("no autoregressive arm measured: no benefit of speculation can be computed")
    for arm in inputs.arms:
        if arm.energy_source is None or arm.energy_j_per_token is None:
            found.append(f"{arm.key}: energy not measured, counted as $0")
        elif "estimate" in arm.energy_source:
            found.append(f"{arm.key}: energy is an estimate ({arm.energy_source.replace('estimate', 'not metered')})")
        if arm.memory_source not in ("measured", "given"):
            found.append(
                f"{arm.key}: memory {arm.memory_source}"
                + (" (whole devices charged)" if arm.target_memory_bytes is None else "")
            )
    if inputs.hidden.monitoring_source == "default":
        found.append(
            f"monitoring storage: {inputs.hidden.monitoring_gb_per_day:g} GB/day assumed (default), not measured"
        )
    return tuple(found)


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)
