"""Where the cost model's inputs come from: the shipped price table, the store, a what-if TOML.

    load_prices(path=None)                          the dated price table (cost/prices.toml)
    measured_inputs(engine, window, prices, ...)    per-arm aggregates of the collector's tables
    what_if_inputs(path, prices, gpu_type=None)     inputs written down in TOML (cost/cost_example.toml)
    apply_overrides(inputs, Overrides(...))         edit prices, volume and hidden costs

Measured, per arm (mode, drafter; plain decoding is one arm whatever its drafter field):
    tokens_per_s        = ok requests' output tokens / their device_s (cost.attribution: the
                          record's own, else processor sharing derived from request times)
    failed_device_s     = device_s of the requests that did not finish ok (the retries line)
    energy_j_per_token  = sum energy_j / ok tokens when every request carries energy; else the
                          instance's energy (device samples' power x interval) attributed to each
                          request by its device time over its life / ok tokens ("attributed", from
                          the samples' power source: metered or estimate)
    memory              = median mem_reserved_bytes of device samples in the window; the draft's
                          share from samples with draft_loaded false or `draft_unloaded` events,
                          else not separated (the plain arm holds no draft: the counterfactual)
    idle                = instances' sampled up-time - Σ device_s of their requests
    window_s            = from the first request in the window to its end
    monitoring storage  = store bytes per stored record x records per day in the window
    incident time       = (optional) firing hours of alerts + 0.5 h per remediation, in person-days/week
"""

from __future__ import annotations

import re
import statistics
import tomllib
from collections import defaultdict
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from sqlalchemy import Engine, func, select, text

from collector.models import AlertActionRow, AlertTransitionRow, DeviceSampleRow, EngineEventRow, Request
from collector.queries import Filters, Window
from cost.attribution import Attribution, Instance, PowerSample, Spans, attribute
from cost.model import GB, Accelerator, CostInputs, HiddenCosts, IdleTime, ModeMeasure, Prices

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
    pricing: str | None = None  # on-demand | spot | reserved | on-prem
    idle_allocation: str | None = None  # separate | by_share


_PRICE_OVERRIDES = ("electricity_usd_per_kwh", "pue")
_HIDDEN_OVERRIDES = (
    "draft_training_usd",
    "training_data_fraction",
    "amortisation_months",
    "monitoring_retention_days",
    "incident_days_per_week",
    "opportunity_days_per_month",
    "tech_debt_buffer",
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
    pricing: str = "on-demand",
    idle_allocation: str = "separate",
    incidents_from_alerts: bool = False,
) -> CostInputs:
    """CostInputs from the requests, device samples, events and alert history stored in `window`
    (module docstring). Monitoring storage is measured from the store when `measure_storage` and it
    holds records; incident time is derived from the alert history when `incidents_from_alerts`."""
    requests = request_columns(engine, window, filters)
    samples = power_samples(engine, window, filters)
    shares = attribute(requests.spans, samples)
    power_source = ",".join(sorted({s.source for s in samples if s.source and s.power_w is not None})) or None
    first_at = float(requests.started_at.min()) if len(requests) else None
    window_s = window.end - max(window.start, first_at if first_at is not None else window.start)
    target, draft, memory_source = _memory(engine, window, filters)
    arms = tuple(
        _measure(key, rows, requests, shares, max(window_s, 1e-9), target, draft, memory_source, power_source)
        for key, rows in sorted(requests.by_arm().items(), key=_arm_order)
        if _serves(rows, requests, shares)
    )
    hidden = _measured_hidden(engine, window, hidden, measure_storage, incidents_from_alerts)
    return CostInputs(
        arms,
        prices,
        gpu_type,
        gpu_count,
        gpu_memory_bytes,
        None,
        hidden,
        pricing,
        _idle_time(shares.instances),
        idle_allocation,
    )


def _measured_hidden(engine: Engine, window: Window, hidden: HiddenCosts, storage: bool, incidents: bool):
    given = hidden.source("monitoring_gb_per_day") == "given"  # a value the user gave wins over the store's
    growth = storage_gb_per_day(engine, window) if storage and not given else None
    if growth is not None:
        hidden = hidden.with_values("measured", monitoring_gb_per_day=growth)
    if incidents:
        hidden = hidden.with_values("measured (alert history)", incident_days_per_week=incident_days(engine, window))
    return hidden


_REQUEST_COLUMNS = {
    "instance": Request.instance,
    "mode": Request.mode,
    "drafter": Request.drafter,
    "started_at": Request.started_at,
    "queue_s": Request.queue_s,
    "e2e_s": Request.e2e_s,
    "status": Request.status,
    "output_tokens": Request.output_tokens,
    "retries": Request.retries,
    "device_s": Request.device_s,
    "device_s_source": Request.device_s_source,
    "energy_j": Request.energy_j,
    "energy_source": Request.energy_source,
    "drafts": Request.num_drafts,
    "draft_tokens": Request.num_draft_tokens,
    "accepted_tokens": Request.num_accepted_tokens,
    "draft_s": Request.draft_s,
    "verify_s": Request.verify_s,
}
_TEXT = ("instance", "mode", "drafter", "status", "device_s_source", "energy_source")
_NULLABLE = ("device_s", "energy_j")  # NULL -> NaN


class RequestColumns:
    """The stored requests of a window the cost model reads, one numpy array per column
    (all statuses: failed work costs device time too)."""

    def __init__(self, rows: list[tuple]) -> None:
        columns = list(zip(*rows)) if rows else [()] * len(_REQUEST_COLUMNS)
        for name, values in zip(_REQUEST_COLUMNS, columns):
            if name in _TEXT:
                array = np.asarray(values, dtype=object)
            elif name in _NULLABLE:
                array = np.array([np.nan if v is None else v for v in values], dtype=float)
            else:
                array = np.asarray(values, dtype=float)
            setattr(self, name, array)
        self.ok = self.status == "ok"

    def __len__(self) -> int:
        return len(self.started_at)

    @property
    def spans(self) -> Spans:
        start = self.started_at + self.queue_s
        return Spans(self.instance, start, np.maximum(self.started_at + self.e2e_s, start), self.device_s)

    def by_arm(self) -> dict[tuple[str, str | None], np.ndarray]:
        """(mode, drafter; None for plain decoding) -> the indices of its requests."""
        keys = [(m, d if m == "speculative" else None) for m, d in zip(self.mode.tolist(), self.drafter.tolist())]
        arms: dict = defaultdict(list)
        for index, key in enumerate(keys):
            arms[key].append(index)
        return {key: np.asarray(indices) for key, indices in arms.items()}


def request_columns(engine: Engine, window: Window, filters: Filters) -> RequestColumns:
    stmt = filters.apply(select(*_REQUEST_COLUMNS.values()), window)
    with engine.connect() as conn:
        return RequestColumns(conn.execute(stmt).all())


def power_samples(engine: Engine, window: Window, filters: Filters) -> list[PowerSample]:
    stmt = select(
        DeviceSampleRow.instance, DeviceSampleRow.at, DeviceSampleRow.power_w, DeviceSampleRow.power_source
    ).where(DeviceSampleRow.at >= window.start, DeviceSampleRow.at < window.end)
    if filters.instance is not None:
        stmt = stmt.where(DeviceSampleRow.instance == filters.instance)
    with engine.connect() as conn:
        return [PowerSample(*row) for row in conn.execute(stmt)]


def _arm_order(item) -> tuple:
    (mode, drafter), _ = item
    return mode != "autoregressive", drafter or ""


def _serves(rows: np.ndarray, r: RequestColumns, shares: Attribution) -> bool:
    ok = rows[r.ok[rows]]
    return shares.device_s[ok].sum() > 0 and r.output_tokens[ok].sum() > 0


def _measure(key, rows, r: RequestColumns, shares: Attribution, window_s, target, draft, memory_source, power_source):
    mode, drafter = key
    ok = rows[r.ok[rows]]
    ok_tokens = int(r.output_tokens[ok].sum())
    device_s = float(shares.device_s[ok].sum())
    energy, source = _energy(rows, r, shares, ok_tokens, power_source)
    draft_bytes, arm_memory_source = _draft_memory(drafter, draft, memory_source)
    return ModeMeasure(
        mode,
        drafter,
        len(ok),
        ok_tokens,
        window_s,
        ok_tokens / device_s,
        energy,
        source,
        int(r.retries[rows].sum()),
        target,
        draft_bytes,
        arm_memory_source,
        int(r.drafts[ok].sum()),
        int(r.draft_tokens[ok].sum()),
        int(r.accepted_tokens[ok].sum()),
        float(r.draft_s[ok].sum()),
        float(r.verify_s[ok].sum()),
        device_s,
        float(shares.device_s[rows[~r.ok[rows]]].sum()),
        _device_source(rows, r, shares),
    )


def _device_source(rows: np.ndarray, r: RequestColumns, shares: Attribution) -> str:
    """engine | processor_sharing | derived (none recorded: processor sharing here) | a mix, joined."""
    recorded = {source or "derived" for source in r.device_s_source[rows[~shares.derived[rows]]].tolist()}
    return ",".join(sorted(recorded | ({"derived"} if shares.derived[rows].any() else set())))


def _energy(rows, r: RequestColumns, shares: Attribution, ok_tokens: int, power_source: str | None):
    """J per ok token: metered per-request energy when every request carries it, else the instance's
    energy attributed by device time over the sample intervals (its power source: measured or estimate),
    over the requests some power reading covers."""
    if ok_tokens <= 0:
        return None, None
    metered = r.energy_j[rows]
    if not np.isnan(metered).any():
        sources = ",".join(sorted({s for s in r.energy_source[rows].tolist() if s}))
        return float(metered.sum()) / ok_tokens, sources or None
    attributed = shares.energy_j[rows]
    covered = ~np.isnan(attributed)  # requests a power reading covers (not those before the first sample)
    covered_tokens = r.output_tokens[rows[covered & r.ok[rows]]].sum()
    if covered_tokens <= 0:
        return None, None
    return float(attributed[covered].sum()) / float(covered_tokens), power_source


def _idle_time(instances: list[Instance]) -> IdleTime | None:
    sampled = [i for i in instances if i.up_s is not None]
    if not sampled:
        return None
    idle_energy = [i.idle_energy_j for i in sampled]
    energy = None if any(j is None for j in idle_energy) else sum(idle_energy)
    return IdleTime(sum(i.up_s for i in sampled), sum(i.busy_s for i in sampled), energy)


def incident_days(engine: Engine, window: Window) -> float:
    """Person-days per week spent on incidents, from the alert history: one engineer per firing alert
    for as long as it fired, plus INCIDENT_ACTION_HOURS per remediation, at 8 hours a day."""
    with engine.connect() as conn:
        transitions = conn.execute(
            select(AlertTransitionRow.fingerprint, AlertTransitionRow.at, AlertTransitionRow.to_state)
            .where(AlertTransitionRow.at < window.end)
            .order_by(AlertTransitionRow.at)
        ).all()
        actions = conn.execute(
            select(func.count()).where(AlertActionRow.at >= window.start, AlertActionRow.at < window.end)
        ).scalar()
    hours = _firing_seconds(transitions, window) / 3600 + INCIDENT_ACTION_HOURS * (actions or 0)
    weeks = max(window.seconds, 3600.0) / (7 * 86400)
    return hours / 8 / weeks


INCIDENT_ACTION_HOURS = 0.5


def _firing_seconds(transitions, window: Window) -> float:
    """Σ over alerts of the time they were firing inside the window."""
    since: dict[str, float] = {}
    total = 0.0
    for fingerprint, at, state in transitions:
        if state == "firing":
            since.setdefault(fingerprint, at)
        elif fingerprint in since:
            start = since.pop(fingerprint)
            total += max(0.0, min(at, window.end) - max(start, window.start))
    return total + sum(max(0.0, window.end - max(start, window.start)) for start in since.values())


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
    """Hidden costs as a file gives them: only what it names is set (source "given")."""

    draft_training_usd: float | None = Field(default=None, ge=0)
    training_data_fraction: float | None = Field(default=None, gt=0, le=10)
    amortisation_months: float | None = Field(default=None, gt=0)
    monitoring_gb_per_day: float | None = Field(default=None, ge=0)
    monitoring_retention_days: float | None = Field(default=None, ge=0)
    incident_days_per_week: float | None = Field(default=None, ge=0)
    opportunity_days_per_month: float | None = Field(default=None, ge=0)
    tech_debt_buffer: float | None = Field(default=None, ge=0, le=10)

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
