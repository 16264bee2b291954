"""The cost model's inputs, frozen: prices, hidden costs, one measured arm, and `CostInputs`.

`cost.model` prices them; `cost.inputs` builds them (store, what-if TOML, price table).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from specwatch.collector.reads.curve_reads import StoredCurve
from specwatch.cost.instances import ArmUse, Device, InstanceUse, StepTime
from specwatch.telemetry import ratios

SECONDS_PER_MONTH = 730 * 3600  # 365 x 24 / 12 hours
DAYS_PER_MONTH = 365 / 12
WEEKS_PER_MONTH = 52 / 12
J_PER_KWH = 3.6e6
MTOK = 1e6
GB = 1e9
MODES = ("speculative", "autoregressive")
# Drafters with no trained weights of the team's own: prompt lookup, suffix decoding, an untrained early
# exit of the target (early-exit:K), and MTP heads shipped with the model. Anything else (a draft model,
# EAGLE, Medusa) is charged its training run.
UNTRAINED_DRAFTERS = ("ngram", "suffix", "mtp")
UNTRAINED_PREFIXES = ("early-exit:",)
PRICINGS = ("on-demand", "spot", "reserved", "on-prem")
SEED = "default (seed)"
__all__ = ["ArmUse", "Device", "InstanceUse", "StepTime"]  # re-exported: the inputs' per-instance parts
# Idle time: its own line, or shared over the arms by device time (weighted) or equally (even), as OpenCost
# does; "by_share" is the older name of "weighted".
IDLE_ALLOCATIONS = ("separate", "weighted", "even", "by_share")
# What the technical-debt reserve is a fraction of: what speculation adds (its drafter's device time and
# memory, training, operations, storage), or the whole speculative deployment's costs (the older reading).
RESERVE_BASES = ("additions", "deployment")


def needs_training(drafter: str | None) -> bool:
    """A drafter with trained weights of the team's own (see UNTRAINED_DRAFTERS)."""
    if drafter is None or drafter in UNTRAINED_DRAFTERS:
        return False
    return not drafter.startswith(UNTRAINED_PREFIXES)


@dataclass(frozen=True)
class Accelerator:
    """One row of the price table: USD per GPU-hour by pricing (None: the table has no such price)."""

    name: str
    usd_per_hour: float  # on-demand
    memory_gb: float
    source: str = ""
    spot_usd_per_hour: float | None = None
    reserved_usd_per_hour: float | None = None  # committed use, per hour of the term
    onprem_usd_per_hour: float | None = None  # on-prem: purchase price / (depreciation years x hours used)

    def price(self, pricing: str) -> float:
        found = {
            "on-demand": self.usd_per_hour,
            "spot": self.spot_usd_per_hour,
            "reserved": self.reserved_usd_per_hour,
            "on-prem": self.onprem_usd_per_hour,
        }.get(pricing)
        if found is None:
            raise ValueError(f"no {pricing} price for {self.name} in the price table (pricings: {', '.join(PRICINGS)})")
        return found


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

    def with_gpu_hour(self, gpu_type: str, usd_per_hour: float, pricing: str = "on-demand") -> Prices:
        field_name = {
            "on-demand": "usd_per_hour",
            "spot": "spot_usd_per_hour",
            "reserved": "reserved_usd_per_hour",
            "on-prem": "onprem_usd_per_hour",
        }[pricing]
        gpu = replace(self.accelerator(gpu_type), **{field_name: usd_per_hour}, source="given")
        return replace(self, accelerators={**self.accelerators, gpu_type: gpu})


@dataclass(frozen=True)
class HiddenCosts:
    """Costs of running speculation that no per-token figure shows, each with where it came from.

    Defaults are the seed's figures; `sources` maps a field to "measured", "config", "given"
    (a file or an override) or, when absent, "default (seed)"."""

    draft_training_usd: float = 15_000.0  # one training run of a 7B-class draft on a p4d.24xlarge
    training_data_fraction: float = 0.10  # the draft's training data / the target's (the run above is at 10%)
    amortisation_months: float = 12.0
    monitoring_gb_per_day: float = 15.0
    monitoring_retention_days: float = 14.0  # the collector's raw retention (settings.retention_days)
    incident_days_per_week: float = 2.0  # person-days of incident handling (or derived from alert history)
    opportunity_days_per_month: float = 0.0  # iteration slowdown, learning curve: engineer-days, none assumed
    tech_debt_buffer: float = 0.20  # reserve on what speculation adds (reserve_base)
    reserve_base: str = "additions"  # additions | deployment (RESERVE_BASES)
    sources: dict[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _require(self.reserve_base in RESERVE_BASES, f"reserve_base must be one of {', '.join(RESERVE_BASES)}")
        _require(self.amortisation_months > 0, "amortisation_months must be > 0")
        _require(0 <= self.tech_debt_buffer <= 10, "tech_debt_buffer must be a fraction in [0, 10]")
        _require(0 < self.training_data_fraction <= 10, "training_data_fraction must be in (0, 10]")
        for name in HIDDEN_FIELDS:
            _require(getattr(self, name) >= 0, f"{name} must be >= 0")

    def source(self, name: str) -> str:
        return self.sources.get(name, SEED)

    def with_values(self, source: str, **values: float) -> HiddenCosts:
        """These fields set to these values, their source recorded."""
        return replace(self, **values, sources={**self.sources, **dict.fromkeys(values, source)})

    @property
    def monitoring_source(self) -> str:
        return self.source("monitoring_gb_per_day")


HIDDEN_FIELDS = (
    "draft_training_usd",
    "training_data_fraction",
    "amortisation_months",
    "monitoring_gb_per_day",
    "monitoring_retention_days",
    "incident_days_per_week",
    "opportunity_days_per_month",
    "tech_debt_buffer",
)
HIDDEN_UNITS = {
    "draft_training_usd": "USD per run at 10% of the target's data",
    "training_data_fraction": "of the target's training data",
    "amortisation_months": "months",
    "monitoring_gb_per_day": "GB / day",
    "monitoring_retention_days": "days",
    "incident_days_per_week": "person-days / week",
    "opportunity_days_per_month": "engineer-days / month",
    "tech_debt_buffer": "fraction of what speculation adds (see reserve base)",
}


@dataclass(frozen=True)
class ModeMeasure:
    """Measured aggregates of one arm (mode, drafter) over `window_s` seconds.

    tokens_per_s: ok output tokens per second of device time attributed to the arm (per
    instance of `gpu_count` GPUs; see the module docstring). device_s / failed_device_s: that
    device time, of ok requests and of the others; device_s_source says how it was attributed.
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
    device_s: float = 0.0  # 0: not measured (what-if inputs give tokens_per_s instead)
    failed_device_s: float = 0.0
    device_s_source: str = "given"  # engine | processor_sharing | derived (processor sharing here) | given

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
            "device_s",
            "failed_device_s",
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
        return ratios.mean_acceptance_length(self.accepted_tokens, self.drafts)

    @property
    def mean_draft_length(self) -> float | None:
        """Drafted tokens per draft: the effective lookahead gamma."""
        return self.draft_tokens / self.drafts if self.drafts else None

    @property
    def target_forwards(self) -> int:
        """Target forwards after prefill: each commits its accepted drafts + 1 token."""
        return max(self.output_tokens - self.requests - self.accepted_tokens, 0)

    @property
    def retry_factor(self) -> float:
        if self.device_s > 0:
            return self.failed_device_s / self.device_s
        return self.retries / self.requests if self.requests else 0.0


@dataclass(frozen=True)
class IdleTime:
    """The instances' device time in the window that no request used (from their device samples)."""

    up_s: float  # Σ over instances of their sampled up-time
    busy_s: float  # Σ device_s of the requests they served
    energy_j: float | None = None  # energy their samples report while idle (None: no power readings)

    @property
    def idle_s(self) -> float:
        return max(self.up_s - self.busy_s, 0.0)


@dataclass(frozen=True)
class CostInputs:
    """Everything the cost model reads. gpu_type, gpu_count, pricing: every instance's unless `devices`
    names its own (`device`); gpu_memory_bytes None: the price table's figure;
    monthly_output_tokens None: the volume observed over the arms' window; idle None: up-time
    not measured; idle_allocation "separate" (its own line) or "by_share" (spread over the arms
    by their device time); pricing one of PRICINGS."""

    arms: tuple[ModeMeasure, ...]
    prices: Prices
    gpu_type: str
    gpu_count: int = 1
    gpu_memory_bytes: float | None = None
    monthly_output_tokens: float | None = None
    hidden: HiddenCosts = field(default_factory=HiddenCosts)
    pricing: str = "on-demand"
    idle: IdleTime | None = None
    idle_allocation: str = "separate"
    instances: tuple[InstanceUse, ...] = ()  # measured per instance (empty: what-if, one instance of the arms)
    step_times: tuple[StepTime, ...] = ()  # per concurrency level and arm (empty: only the arms' totals)
    step_curves: tuple[StoredCurve, ...] = ()  # the engines' step-cost curves (cost.step_curve; empty: none)
    devices: tuple[Device, ...] = ()  # what each instance runs on (unlisted: gpu_type, gpu_count, pricing)
    retry_split: tuple[int, int] = (0, 0)  # retried ok requests: (failed attempts' time measured, assumed)

    def __post_init__(self) -> None:
        _require(self.pricing in PRICINGS, f"pricing must be one of {', '.join(PRICINGS)}")
        self.prices.accelerator(self.gpu_type).price(self.pricing)
        for device in self.devices:
            _require(device.gpu_count is None or device.gpu_count >= 1, f"{device.instance}: gpu_count must be >= 1")
            self.device(device.instance)  # a known GPU type with a price at its pricing
        _require(
            self.idle_allocation in IDLE_ALLOCATIONS, f"idle_allocation must be one of {', '.join(IDLE_ALLOCATIONS)}"
        )
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
        return self.prices.accelerator(self.gpu_type).price(self.pricing)

    def device(self, instance: str) -> Device:
        """The instance's device, priced: its own (`devices`), else gpu_type x gpu_count at the pricing."""
        own = next((d for d in self.devices if d.instance == instance), None) or Device(instance, self.gpu_type)
        return own.priced(self.prices, self.gpu_count, self.pricing)

    def memory_bytes_of(self, device: Device) -> float:
        """Memory of one GPU of `device`: given, else the price table's for its type."""
        return self.gpu_memory_bytes or self.prices.accelerator(device.gpu_type).memory_gb * GB

    @property
    def energy_added(self) -> bool:
        """On-prem pays for power itself; a cloud GPU-hour price already includes it."""
        return self.pricing == "on-prem"

    @property
    def device_memory_bytes(self) -> float:
        """Memory of one device: given, else the price table's."""
        return self.gpu_memory_bytes or self.prices.accelerator(self.gpu_type).memory_gb * GB

    @property
    def window_s(self) -> float:
        return max((arm.window_s for arm in self.arms), default=0.0)

    @property
    def idle_method(self) -> str:
        """separate | weighted | even ("by_share" is weighted)."""
        return "weighted" if self.idle_allocation == "by_share" else self.idle_allocation

    @property
    def usage(self) -> tuple[InstanceUse, ...]:
        """The instances measured; for what-if inputs one instance per arm (each a way of serving the volume):
        its device time is its output tokens (1M when none given) / tokens_per_s, its failed work that x its
        retry factor, its share its memory (whole device when not given), its idle time in the proportion
        `idle` gives."""
        if self.instances:
            return self.instances
        return tuple(self._what_if_instance(arm) for arm in self.arms)

    def _what_if_instance(self, arm: ModeMeasure) -> InstanceUse:
        use = _what_if_use(arm)
        busy = use.device_s + use.failed_device_s
        up = busy * self.idle.up_s / self.idle.busy_s if self.idle and self.idle.busy_s > 0 else None
        share = _memory_fraction(arm, self)
        source = "whole device (memory not measured)" if share is None else arm.memory_source
        return InstanceUse(f"what-if:{arm.key}", up, (use,), 1.0 if share is None else min(share, 1.0), source)

    @property
    def baseline(self) -> ModeMeasure | None:
        return next((arm for arm in self.arms if arm.mode == "autoregressive"), None)

    @property
    def speculative_arms(self) -> tuple[ModeMeasure, ...]:
        return tuple(arm for arm in self.arms if arm.mode == "speculative")


def _what_if_use(arm: ModeMeasure) -> ArmUse:
    tokens = arm.output_tokens or int(MTOK)
    device_s = tokens / arm.tokens_per_s
    failed = device_s * arm.retry_factor
    energy = None if arm.energy_j_per_token is None else arm.energy_j_per_token * tokens
    return ArmUse(arm.key, device_s, failed, tokens, energy, None if energy is None else energy * arm.retry_factor)


def _memory_fraction(arm: ModeMeasure, inputs: CostInputs) -> float | None:
    if arm.target_memory_bytes is None:
        return None
    return (arm.target_memory_bytes + arm.draft_memory_bytes) / (inputs.gpu_count * inputs.device_memory_bytes)


@dataclass(frozen=True)
class Assumption:
    """One input of the model: its value and where it came from."""

    name: str
    value: float | str
    unit: str
    source: str  # measured | price table <date> | default (seed) | config | given | observed | ...


def monthly_volume(inputs: CostInputs) -> tuple[float, str]:
    """Output tokens per month: given, else observed = tokens / window_s x SECONDS_PER_MONTH."""
    if inputs.monthly_output_tokens is not None:
        return inputs.monthly_output_tokens, "given"
    if not inputs.arms:
        return 0.0, "observed"
    window_s = max(arm.window_s for arm in inputs.arms)
    return sum(arm.output_tokens for arm in inputs.arms) / window_s * SECONDS_PER_MONTH, "observed"


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)
