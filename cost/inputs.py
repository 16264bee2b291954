"""Where the cost model's inputs come from: the shipped price table, the store, a what-if TOML.

    load_prices(path=None)                          the dated price table (cost/prices.toml)
    measured_inputs(engine, window, prices, ...)    per-arm aggregates of the collector's tables
    what_if_inputs(path, prices, gpu_type=None)     inputs written down in TOML (cost/cost_example.toml)
    apply_overrides(inputs, Overrides(...))         edit prices, volume and hidden costs

Measured, per arm (mode, drafter; plain decoding is one arm whatever its drafter field):
    tokens_per_s        = sum of ok requests' output tokens / sum of their (e2e_s - queue_s)
    energy_j_per_token  = sum energy_j / output tokens of the requests that carry energy
                          (their energy_source); without any, mean power_w of device samples
                          taken while serving / tokens_per_s, labelled "estimate"
    memory              = median mem_reserved_bytes of device samples in the window; the draft's
                          share from samples with draft_loaded false or `draft_unloaded` events,
                          else not separated (the plain arm holds no draft: the counterfactual)
    window_s            = from the first request in the window to its end
    monitoring storage  = store bytes per stored record x records per day in the window
"""

from __future__ import annotations

import re
import statistics
import tomllib
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from sqlalchemy import Engine, case, func, select, text

from collector.models import DeviceSampleRow, EngineEventRow, Request
from collector.queries import Filters, Window
from cost.model import GB, Accelerator, CostInputs, HiddenCosts, ModeMeasure, Prices

PRICES_PATH = Path(__file__).with_name("prices.toml")


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _AcceleratorToml(_Model):
    usd_per_hour: float = Field(ge=0)
    memory_gb: float = Field(gt=0)
    source: str = ""


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
    gpus = {name: Accelerator(name, g.usd_per_hour, g.memory_gb, g.source) for name, g in table.accelerators.items()}
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
    amortisation_months: float | None = None
    incident_days_per_week: float | None = None
    tech_debt_buffer: float | None = None


_PRICE_OVERRIDES = ("electricity_usd_per_kwh", "pue")
_HIDDEN_OVERRIDES = ("draft_training_usd", "amortisation_months", "incident_days_per_week", "tech_debt_buffer")


def apply_overrides(inputs: CostInputs, overrides: Overrides) -> CostInputs:
    """The inputs with every given override applied (ValueError when one is out of range)."""
    given = {k: v for k, v in overrides.__dict__.items() if v is not None}
    prices = replace(inputs.prices, **{k: given[k] for k in _PRICE_OVERRIDES if k in given})
    if "gpu_hour_usd" in given:
        prices = prices.with_gpu_hour(inputs.gpu_type, given["gpu_hour_usd"])
    hidden = replace(inputs.hidden, **{k: given[k] for k in _HIDDEN_OVERRIDES if k in given})
    return replace(
        inputs,
        prices=prices,
        hidden=hidden,
        monthly_output_tokens=given.get("monthly_output_tokens", inputs.monthly_output_tokens),
    )


# --- measured ---------------------------------------------------------------------------


def measured_inputs(
    engine: Engine,
    window: Window,
    prices: Prices,
    *,
    gpu_type: str,
    gpu_count: int = 1,
    gpu_memory_bytes: float | None = None,
    hidden: HiddenCosts = HiddenCosts(),
    filters: Filters = Filters(),
    measure_storage: bool = True,
) -> CostInputs:
    """CostInputs from the requests, device samples and events stored in `window` (module docstring).
    Monitoring storage is measured from the store when `measure_storage` and it holds records."""
    totals, first_at = _arm_totals(engine, window, filters)
    window_s = window.end - max(window.start, first_at if first_at is not None else window.start)
    target, draft, memory_source = _memory(engine, window, filters)
    power_w = _serving_power(engine, window, filters)
    arms = tuple(
        _measure(key, t, max(window_s, 1e-9), target, draft, memory_source, power_w)
        for key, t in sorted(totals.items(), key=lambda kv: (kv[0][0] != "autoregressive", kv[0][1] or ""))
        if t["busy_s"] > 0 and t["ok_tokens"] > 0
    )
    growth = storage_gb_per_day(engine, window) if measure_storage else None
    if growth is not None:
        hidden = replace(hidden, monitoring_gb_per_day=growth, monitoring_source="measured")
    return CostInputs(arms, prices, gpu_type, gpu_count, gpu_memory_bytes, None, hidden)


_SUMMED = {
    "requests": func.count(),
    "output_tokens": func.sum(Request.output_tokens),
    "ok_tokens": func.sum(case((Request.status == "ok", Request.output_tokens), else_=0)),
    "busy_s": func.sum(case((Request.status == "ok", Request.e2e_s - Request.queue_s), else_=0.0)),
    "retries": func.sum(Request.retries),
    "energy_j": func.sum(func.coalesce(Request.energy_j, 0.0)),
    "metered_tokens": func.sum(case((Request.energy_j.is_not(None), Request.output_tokens), else_=0)),
    "drafts": func.sum(Request.num_drafts),
    "draft_tokens": func.sum(Request.num_draft_tokens),
    "accepted_tokens": func.sum(Request.num_accepted_tokens),
    "draft_s": func.sum(Request.draft_s),
    "verify_s": func.sum(Request.verify_s),
}


def _arm_totals(engine: Engine, window: Window, filters: Filters) -> tuple[dict, float | None]:
    """(mode, drafter) -> summed columns (+ the set of energy sources); and the first request time."""
    stmt = filters.apply(
        select(Request.mode, Request.drafter, Request.energy_source, func.min(Request.started_at), *_SUMMED.values()),
        window,
    ).group_by(Request.mode, Request.drafter, Request.energy_source)
    totals: dict = defaultdict(lambda: {**dict.fromkeys(_SUMMED, 0.0), "sources": set()})
    first_at = None
    with engine.connect() as conn:
        for mode, drafter, source, started, *sums in conn.execute(stmt):
            arm = totals[(mode, drafter if mode == "speculative" else None)]
            for name, value in zip(_SUMMED, sums):
                arm[name] += float(value or 0)
            arm["sources"] |= {source} if source else set()
            first_at = started if first_at is None else min(first_at, started)
    return totals, first_at


def _measure(key, t: dict, window_s: float, target, draft, memory_source, power_w) -> ModeMeasure:
    mode, drafter = key
    tokens_per_s = t["ok_tokens"] / t["busy_s"]
    energy, source = _energy(t, tokens_per_s, power_w)
    draft_bytes, arm_memory_source = _draft_memory(drafter, draft, memory_source)
    return ModeMeasure(
        mode,
        drafter,
        int(t["requests"]),
        int(t["output_tokens"]),
        window_s,
        tokens_per_s,
        energy,
        source,
        int(t["retries"]),
        target,
        draft_bytes,
        arm_memory_source,
        int(t["drafts"]),
        int(t["draft_tokens"]),
        int(t["accepted_tokens"]),
        t["draft_s"],
        t["verify_s"],
    )


def _energy(t: dict, tokens_per_s: float, power_w: float | None) -> tuple[float | None, str | None]:
    """Metered energy per token when requests carry it, else serving power / throughput (an estimate)."""
    if t["metered_tokens"] > 0:
        return t["energy_j"] / t["metered_tokens"], ",".join(sorted(t["sources"])) or None
    if power_w is not None:
        return power_w / tokens_per_s, "estimate"
    return None, None


def _draft_memory(drafter: str | None, draft: float | None, memory_source: str) -> tuple[float, str]:
    """Plain decoding holds no draft; n-gram lookup holds no weights; a model draft what was measured."""
    if drafter is None or drafter == "ngram":
        return 0.0, memory_source
    if draft is None:
        return 0.0, "draft not separated from target" if memory_source != "unmeasured" else memory_source
    return draft, memory_source


def _memory(engine: Engine, window: Window, filters: Filters) -> tuple[float | None, float | None, str]:
    """(target bytes, draft bytes or None, source): medians of mem_reserved_bytes in the window."""
    stmt = select(DeviceSampleRow.mem_reserved_bytes, DeviceSampleRow.draft_loaded).where(
        DeviceSampleRow.at >= window.start, DeviceSampleRow.at < window.end
    )
    if filters.instance is not None:
        stmt = stmt.where(DeviceSampleRow.instance == filters.instance)
    with engine.connect() as conn:
        rows = conn.execute(stmt).all()
    if not rows:
        return None, None, "unmeasured"
    loaded = [r for r, is_loaded in rows if is_loaded is not False] or [r for r, _ in rows]
    plain = [r for r, is_loaded in rows if is_loaded is False]
    held = statistics.median(loaded)
    if plain:
        target = statistics.median(plain)
        return target, max(0.0, held - target), "measured"
    freed = _freed_by_unloads(engine, window, filters)
    if freed is not None:
        return max(0.0, held - freed), freed, "measured"
    return held, None, "measured"


def _freed_by_unloads(engine: Engine, window: Window, filters: Filters) -> float | None:
    """Median memory a `draft_unloaded` event freed (reserved bytes, else process RSS)."""
    stmt = select(EngineEventRow.detail).where(
        EngineEventRow.kind == "draft_unloaded", EngineEventRow.at >= window.start, EngineEventRow.at < window.end
    )
    if filters.instance is not None:
        stmt = stmt.where(EngineEventRow.instance == filters.instance)
    with engine.connect() as conn:
        freed = [_freed(detail) for (detail,) in conn.execute(stmt)]
    freed = [f for f in freed if f is not None and f > 0]
    return statistics.median(freed) if freed else None


def _freed(detail: dict) -> float | None:
    before, after = detail.get("before") or {}, detail.get("after") or {}
    if isinstance(before.get("reserved"), (int, float)) and isinstance(after.get("reserved"), (int, float)):
        return float(before["reserved"] - after["reserved"])
    freed = detail.get("freed_rss_bytes")
    return float(freed) if isinstance(freed, (int, float)) else None


def _serving_power(engine: Engine, window: Window, filters: Filters) -> float | None:
    """Mean power_w of device samples taken while requests were active (None without power readings)."""
    stmt = select(func.avg(DeviceSampleRow.power_w)).where(
        DeviceSampleRow.at >= window.start,
        DeviceSampleRow.at < window.end,
        DeviceSampleRow.active_requests > 0,
        DeviceSampleRow.power_w.is_not(None),
    )
    if filters.instance is not None:
        stmt = stmt.where(DeviceSampleRow.instance == filters.instance)
    with engine.connect() as conn:
        mean = conn.execute(stmt).scalar()
    return None if mean is None else float(mean)


def storage_gb_per_day(engine: Engine, window: Window) -> float | None:
    """Store growth: database bytes per stored record x records stored per day in the window
    (None when the store is empty or its size cannot be read)."""
    tables = (Request.__table__, DeviceSampleRow.__table__, EngineEventRow.__table__)
    times = (Request.started_at, DeviceSampleRow.at, EngineEventRow.at)
    with engine.connect() as conn:
        total = sum(conn.execute(select(func.count()).select_from(t)).scalar() for t in tables)
        in_window = [
            conn.execute(select(func.count(), func.min(c), func.max(c)).where(c >= window.start, c < window.end)).one()
            for c in times
        ]
        size = _database_bytes(conn)
    starts = [lo for n, lo, _ in in_window if n]
    if not total or not size or not starts:
        return None
    days = max(window.end - max(window.start, min(starts)), 3600.0) / 86400
    return sum(n for n, _, _ in in_window) * size / total / days / GB


def _database_bytes(conn) -> float | None:
    if conn.dialect.name == "sqlite":
        return float(conn.execute(text("PRAGMA page_count")).scalar() * conn.execute(text("PRAGMA page_size")).scalar())
    if conn.dialect.name == "postgresql":
        return float(conn.execute(text("SELECT pg_database_size(current_database())")).scalar())
    return None


# Device names (DeviceSample.device) -> price table rows: the first pattern that matches.
DEVICE_PATTERNS = (
    ("H200", r"\bH200\b"),
    ("H100-SXM", r"\bH100\b"),
    ("A100-80GB", r"\bA100\b"),
    ("L4", r"\bL4\b"),
    ("cpu-laptop", r"^cpu$"),
)


def infer_gpu_type(engine: Engine, window: Window, prices: Prices) -> str | None:
    """The price table row of the device most samples in the window came from (None: no match)."""
    stmt = (
        select(DeviceSampleRow.device, func.count())
        .where(DeviceSampleRow.at >= window.start, DeviceSampleRow.at < window.end)
        .group_by(DeviceSampleRow.device)
    )
    with engine.connect() as conn:
        devices = sorted(conn.execute(stmt).all(), key=lambda row: -row[1])
    for device, _ in devices:
        for gpu_type, pattern in DEVICE_PATTERNS:
            if gpu_type in prices.accelerators and re.search(pattern, device, re.IGNORECASE):
                return gpu_type
    return None


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
    draft_training_usd: float = Field(default=15_000.0, ge=0)
    amortisation_months: float = Field(default=12.0, gt=0)
    monitoring_gb_per_day: float = Field(default=15.0, ge=0)
    monitoring_retention_days: float = Field(default=30.0, ge=0)
    incident_days_per_week: float = Field(default=2.0, ge=0)
    tech_debt_buffer: float = Field(default=0.2, ge=0, le=10)


class _WhatIfToml(_Model):
    gpu_type: str = "H100-SXM"
    gpu_count: int = Field(default=1, ge=1)
    gpu_memory_gb: float | None = Field(default=None, gt=0)
    monthly_output_tokens: float | None = Field(default=None, ge=0)
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
        prices = prices.with_gpu_hour(gpu, gpu_hour)
    hidden = HiddenCosts(**spec.hidden.model_dump(), monitoring_source="given")
    memory = None if spec.gpu_memory_gb is None else spec.gpu_memory_gb * GB
    return CostInputs(
        tuple(arm.measure() for arm in spec.arms),
        prices,
        gpu,
        spec.gpu_count,
        memory,
        spec.monthly_output_tokens,
        hidden,
    )
