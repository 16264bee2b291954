"""Where the cost model's inputs come from: the shipped price table, a what-if TOML, overrides.

load_prices(path=None)                          the dated price table (cost/prices.toml)
load_fleet(path, prices=None)                   a fleet file: what each instance runs on (cost.fleet)
what_if_inputs(path, prices, gpu_type=None)     inputs written down in TOML (cost/cost_example.toml)
apply_overrides(inputs, Overrides(...))         edit prices, volume and hidden costs
measured_inputs(db, window, prices, ...)    from the store (cost.measured, re-exported here)
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from specwatch.cost.fleet import Fleet
from specwatch.cost.instances import FLEET, Device
from specwatch.cost.measured import incident_days, infer_gpu_type, measured_inputs, storage_gb_per_day
from specwatch.cost.model import GB, Accelerator, CostInputs, HiddenCosts, ModeMeasure, Prices

# the store's side lives in cost.measured; these names stay importable from here
__all__ = ["incident_days", "infer_gpu_type", "measured_inputs", "storage_gb_per_day"]

PRICES_PATH = Path(__file__).with_name("prices.toml")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _AcceleratorToml(_Model):
    usd_per_hour: float = Field(ge=0)
    memory_gb: float = Field(gt=0)
    source: str = ""
    spot_usd_per_hour: float | None = Field(default=None, ge=0)
    reserved_usd_per_hour: float | None = Field(default=None, ge=0)
    onprem_usd_per_hour: float | None = Field(default=None, ge=0)


class _PricesToml(_Model):
    as_of: str
    currency: Literal["USD"] = "USD"
    electricity: dict[Literal["usd_per_kwh", "pue"], float]
    storage: dict[Literal["usd_per_gb_month"], float]
    labour: dict[Literal["engineer_day_usd"], float]
    accelerators: dict[str, _AcceleratorToml] = Field(min_length=1)


def one_line(exc: ValidationError, where: str) -> str:
    """The first validation error as one line: 'FILE: key.path: message'."""
    error = exc.errors()[0]
    location = ".".join(str(part) for part in error["loc"]) or "(top level)"
    return f"{where}: {location}: {error['msg']}"


def _read_toml(path: Path) -> dict:
    try:
        with open(path, "rb") as handle:
            return tomllib.load(handle)
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: not valid TOML: {exc}") from None


def load_prices(path: Path | None = None) -> Prices:
    """The price table (default: the shipped cost/prices.toml). ValueError on a bad file."""
    path = path or PRICES_PATH
    try:
        table = _PricesToml.model_validate(_read_toml(path))
    except ValidationError as exc:
        raise ValueError(one_line(exc, str(path))) from None
    gpus = {name: Accelerator(name, **g.model_dump()) for name, g in table.accelerators.items()}
    return Prices(
        gpus,
        table.electricity.get("usd_per_kwh", 0.12),
        table.electricity.get("pue", 1.3),
        table.storage.get("usd_per_gb_month", 0.08),
        table.labour.get("engineer_day_usd", 800.0),
        table.as_of,
    )


@dataclass(frozen=True)
class Overrides:
    """Edits to prices, volume and hidden costs (None: keep). Shared by the CLI, what-if and /v1/cost."""

    gpu_hour_usd: float | None = None
    electricity_usd_per_kwh: float | None = None
    pue: float | None = None
    monthly_output_tokens: float | None = None
    draft_training_usd: float | None = None
    training_data_fraction: float | None = None
    amortisation_months: float | None = None
    monitoring_retention_days: float | None = None
    incident_days_per_week: float | None = None
    opportunity_days_per_month: float | None = None
    tech_debt_buffer: float | None = None
    reserve_base: str | None = None  # additions | deployment
    pricing: str | None = None  # on-demand | spot | reserved | on-prem
    idle_allocation: str | None = None  # separate | weighted | even (by_share: weighted)
    gpu_type: str | None = None  # every instance priced as this GPU (--gpu), whatever its samples or fleet entry
    fleet: Fleet | None = None  # each named instance's GPU, pricing and dedication (--fleet): read when measuring


_PRICE_OVERRIDES = ("electricity_usd_per_kwh", "pue")
_HIDDEN_OVERRIDES = (
    "draft_training_usd",
    "training_data_fraction",
    "amortisation_months",
    "monitoring_retention_days",
    "incident_days_per_week",
    "opportunity_days_per_month",
    "tech_debt_buffer",
    "reserve_base",
)


def apply_overrides(inputs: CostInputs, overrides: Overrides) -> CostInputs:
    """The inputs with every given override applied (ValueError when one is out of range)."""
    given = {k: v for k, v in overrides.__dict__.items() if v is not None}
    prices = replace(inputs.prices, **{k: given[k] for k in _PRICE_OVERRIDES if k in given})
    pricing = given.get("pricing", inputs.pricing)
    if "gpu_hour_usd" in given:
        prices = prices.with_gpu_hour(inputs.gpu_type, given["gpu_hour_usd"], pricing)
    hidden = inputs.hidden.with_values("given", **{k: given[k] for k in _HIDDEN_OVERRIDES if k in given})
    return replace(
        inputs,
        prices=prices,
        hidden=hidden,
        monthly_output_tokens=given.get("monthly_output_tokens", inputs.monthly_output_tokens),
        pricing=pricing,
        idle_allocation=given.get("idle_allocation", inputs.idle_allocation),
    )


# --- fleet file ------------------------------------------------------------------------


class _FleetEntryToml(_Model):
    gpu_type: str
    gpu_count: int | None = Field(default=None, ge=1)
    pricing: Literal["on-demand", "spot", "reserved", "on-prem"] | None = None
    gpu_hour_usd: float | None = Field(default=None, ge=0, allow_inf_nan=False)
    commitment: str | None = None
    dedicated: bool = False

    @model_validator(mode="after")
    def _commitment_is_reserved(self) -> _FleetEntryToml:
        if self.commitment is not None and self.pricing != "reserved":
            raise ValueError("commitment goes with pricing = 'reserved'")
        return self


def load_fleet(path: Path, prices: Prices | None = None) -> Fleet:
    """A fleet file: one table per instance name (keys: gpu_type, gpu_count, pricing, gpu_hour_usd,
    commitment, dedicated; docs/cost.md). ValueError, one line, on a bad file, or (with `prices`) a GPU
    type the price table lacks or has no price for at that pricing."""
    table = _read_toml(path)
    if not table:
        raise ValueError(f"{path}: no instance in the fleet file")
    return Fleet(tuple(_fleet_device(path, name, entry, prices) for name, entry in table.items()), str(path))


def _fleet_device(path: Path, name: str, entry, prices: Prices | None) -> Device:
    if not isinstance(entry, dict):
        raise ValueError(f"{path}: {name}: expected a table of gpu_type, gpu_count, pricing, ... (docs/cost.md)")
    try:
        spec = _FleetEntryToml.model_validate(entry)
    except ValidationError as exc:
        raise ValueError(one_line(exc, f"{path}: {name}")) from None
    device = Device(name, **spec.model_dump(), source=FLEET)
    if prices is not None:
        try:
            device.priced(prices, 1, "on-demand")
        except ValueError as exc:
            raise ValueError(f"{path}: {name}: {exc}") from None
    return device


# --- what-if TOML ----------------------------------------------------------------------


class _ArmToml(_Model):
    mode: Literal["speculative", "autoregressive"]
    drafter: str | None = None
    tokens_per_s: float = Field(gt=0)
    requests: int = Field(default=0, ge=0)
    output_tokens: int = Field(default=0, ge=0)
    window_s: float = Field(default=86_400.0, gt=0)
    energy_j_per_token: float | None = Field(default=None, ge=0)
    energy_source: Literal["nvml", "rapl", "estimate"] | None = None
    retries: int = Field(default=0, ge=0)
    target_memory_gb: float | None = Field(default=None, ge=0)
    draft_memory_gb: float = Field(default=0.0, ge=0)
    drafts: int = Field(default=0, ge=0)
    draft_tokens: int = Field(default=0, ge=0)
    accepted_tokens: int = Field(default=0, ge=0)
    draft_s: float = Field(default=0.0, ge=0)
    verify_s: float = Field(default=0.0, ge=0)

    @model_validator(mode="after")
    def _energy_has_source(self) -> _ArmToml:
        if (self.energy_j_per_token is None) != (self.energy_source is None):
            raise ValueError("energy_j_per_token and energy_source go together")
        return self

    def measure(self) -> ModeMeasure:
        fields = self.model_dump(exclude={"target_memory_gb", "draft_memory_gb"})
        target = None if self.target_memory_gb is None else self.target_memory_gb * GB
        return ModeMeasure(
            **fields,
            target_memory_bytes=target,
            draft_memory_bytes=self.draft_memory_gb * GB,
            memory_source="given" if target is not None else "unmeasured",
        )


class _PriceOverridesToml(_Model):
    gpu_hour_usd: float | None = Field(default=None, ge=0)
    electricity_usd_per_kwh: float | None = Field(default=None, ge=0)
    pue: float | None = Field(default=None, ge=1)
    storage_usd_per_gb_month: float | None = Field(default=None, ge=0)
    engineer_day_usd: float | None = Field(default=None, ge=0)


class _HiddenToml(_Model):
    """Hidden costs as a file gives them: only what it names is set (source "given")."""

    draft_training_usd: float | None = Field(default=None, ge=0)
    training_data_fraction: float | None = Field(default=None, gt=0, le=10)
    amortisation_months: float | None = Field(default=None, gt=0)
    monitoring_gb_per_day: float | None = Field(default=None, ge=0)
    monitoring_retention_days: float | None = Field(default=None, ge=0)
    incident_days_per_week: float | None = Field(default=None, ge=0)
    opportunity_days_per_month: float | None = Field(default=None, ge=0)
    tech_debt_buffer: float | None = Field(default=None, ge=0, le=10)
    reserve_base: Literal["additions", "deployment"] | None = None

    def apply(self, hidden: HiddenCosts) -> HiddenCosts:
        return hidden.with_values("given", **self.model_dump(exclude_none=True))


def load_hidden_costs(path: Path, hidden: HiddenCosts = HiddenCosts()) -> HiddenCosts:
    """Hidden-cost overrides from a TOML file (the keys of [hidden] in cost/cost_example.toml, at the top
    level or under [hidden]); ValueError, one line, when bad."""
    table = _read_toml(path)
    try:
        return _HiddenToml.model_validate(table.get("hidden", table)).apply(hidden)
    except ValidationError as exc:
        raise ValueError(one_line(exc, str(path))) from None


class _WhatIfToml(_Model):
    gpu_type: str = "H100-SXM"
    gpu_count: int = Field(default=1, ge=1)
    gpu_memory_gb: float | None = Field(default=None, gt=0)
    monthly_output_tokens: float | None = Field(default=None, ge=0)
    pricing: Literal["on-demand", "spot", "reserved", "on-prem"] = "on-demand"
    prices: _PriceOverridesToml = _PriceOverridesToml()
    hidden: _HiddenToml = _HiddenToml()
    arms: list[_ArmToml] = Field(min_length=1)


def what_if_inputs(path: Path, prices: Prices, gpu_type: str | None = None) -> CostInputs:
    """CostInputs from a what-if TOML file (keys: cost/cost_example.toml); ValueError, one line, when bad."""
    try:
        spec = _WhatIfToml.model_validate(_read_toml(path))
    except ValidationError as exc:
        raise ValueError(one_line(exc, str(path))) from None
    try:
        return _what_if(spec, prices, gpu_type or spec.gpu_type)
    except ValueError as exc:
        raise ValueError(f"{path}: {exc}") from None


def _what_if(spec: _WhatIfToml, prices: Prices, gpu: str) -> CostInputs:
    price_edits = spec.prices.model_dump(exclude_none=True)
    gpu_hour = price_edits.pop("gpu_hour_usd", None)
    prices = replace(prices, **price_edits)
    if gpu_hour is not None:
        prices = prices.with_gpu_hour(gpu, gpu_hour, spec.pricing)
    hidden = spec.hidden.apply(HiddenCosts())
    memory = None if spec.gpu_memory_gb is None else spec.gpu_memory_gb * GB
    return CostInputs(
        tuple(arm.measure() for arm in spec.arms),
        prices,
        gpu,
        spec.gpu_count,
        memory,
        spec.monthly_output_tokens,
        hidden,
        spec.pricing,
    )
