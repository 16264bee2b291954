"""The cost model's inputs from the store: `measured_inputs(db, window, prices, ...)`.

Per arm (mode, drafter; plain decoding is one arm whatever its drafter field) and instance:

    overlap             a request is charged for the part of its life [started_at + queue_s,
                        started_at + e2e_s] inside the window: its device time, output tokens and
                        energy times that fraction (one straddling the start by 15 s of 40 s: 25 s)
    device_s            the record's own (engine: its share of each forward; gateway: processor
                        sharing), else derived here by processor sharing over request times (the
                        arm's figures then carry "~": partly derived); a gateway record at an upstream
                        more than one gateway reported: processor sharing over all their records
                        (cost.sharing; `gateway_ps_merged`, derived too)
    failed work         device time of requests not ok, and of the failed attempts of ok requests that
                        were retried: measured where the record says (`failed_device_s`, the bundled
                        engine's), else assumed (k retries: k/(k+1) of the record's device time, each
                        attempt taken as costing the same; `retry_split` counts both); the arm's retries
                        line, in the mode and arm the record keeps, so a speculative failure retried
                        plainly is speculation's
    energy_j_per_token  energy of ok requests / their tokens (metered per request, else the instance's
                        energy attributed by device rate); failed work's energy goes to retries only
    device              each instance's own (cost.fleet): an explicit GPU for all, else its fleet file
                        entry, else the GPU its device samples name, else `gpu_type` (an estimate)
    share               the instance's median reserved memory / its devices' memory (<= 1): the rest is
                        "other tenants of the device"; 1 when a fleet file declares it dedicated
    up-time             the instance's device samples (first interval to last sample)
    memory              median mem_reserved_bytes; the draft's part from samples with draft_loaded
                        false or `draft_unloaded` events
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

import numpy as np
from sqlalchemy import Engine

from specwatch.collector.reads.curve_reads import step_curves
from specwatch.collector.reads.queries import Filters, Window
from specwatch.collector.reads.usage import (
    GATEWAY_SOURCE,
    RequestColumns,
    freed_by_unloads,
    gateway_lives,
    memory_rows,
    power_rows,
    request_usage,
    store_growth,
)
from specwatch.cost.attribution import Attribution, PowerSample, Spans, attribute, levels
from specwatch.cost.fleet import DEVICE_PATTERNS as DEVICE_PATTERNS  # moved to cost.fleet; importable here
from specwatch.cost.fleet import DeviceChoice, Fleet, pick_devices, shares
from specwatch.cost.fleet import infer_gpu_type as infer_gpu_type
from specwatch.cost.sharing import MERGED_SOURCE, Lives, merged_device_s
from specwatch.cost.terms import (
    GB,
    ArmUse,
    CostInputs,
    Device,
    HiddenCosts,
    IdleTime,
    InstanceUse,
    ModeMeasure,
    Prices,
    StepTime,
)


@dataclass(frozen=True)
class Usage:
    """The window's requests clipped to it, and who used the device when (one entry per request)."""

    columns: RequestColumns
    fraction: np.ndarray  # of each request's life inside the window
    device_s: np.ndarray  # clipped
    failed_s: np.ndarray  # the failed part of device_s (not ok: all; retried: k / (k + 1))
    ok_part: np.ndarray  # 1 - the failed part, as a fraction (energy splits the same way)
    tokens: np.ndarray  # clipped ok output tokens (0 for failed requests)
    energy_j: np.ndarray  # clipped, NaN: not covered by a power reading
    derived: np.ndarray  # bool
    sources: np.ndarray  # how each device_s was had: the record's device_s_source, derived or gateway_ps_merged
    concurrency: np.ndarray
    attribution: Attribution
    samples: tuple[PowerSample, ...]
    outside: dict[str, tuple[float, float]] | None = None  # a narrower view: instance -> (device_s, energy_j)

    @property
    def arm_keys(self) -> np.ndarray:
        c = self.columns
        return np.array([arm_key(m, d) for m, d in zip(c.mode.tolist(), c.drafter.tolist())], dtype=object)


def arm_key(mode: str, drafter: str | None) -> str:
    return mode if mode != "speculative" or drafter is None else f"{mode}:{drafter}"


def read_usage(db: Engine, window: Window, filters: Filters = Filters()) -> Usage:
    """Requests overlapping `window` clipped to it, attributed (module docstring). A view narrower than its
    instances (a tag, model, drafter, mode or arm) is read with every request of those instances, so device
    time is shared among all who used the device at once, then narrowed to the view (`Usage.outside`)."""
    scope = filters.scope
    c = request_usage(db, window, scope, view=None if filters == scope else filters)
    start, end = _life(c.started_at, c.queue_s, c.e2e_s)
    lo, hi = np.maximum(start, window.start), np.minimum(end, window.end)
    life = end - start
    inside = (c.started_at >= window.start) & (c.started_at < window.end)
    fraction = np.where(life > 0, np.clip(hi - lo, 0.0, None) / np.where(life > 0, life, 1.0), inside.astype(float))
    samples = tuple(PowerSample(*row) for row in power_rows(db, window, scope))
    lo, hi = np.minimum(lo, hi), np.maximum(hi, lo)
    merged = _merged_sharing(db, window, scope, c, lo, hi)
    spans = Spans(c.instance, lo, hi, np.where(np.isnan(merged), c.device_s * fraction, merged))
    shares = attribute(spans, list(samples))
    sources = np.where(~np.isnan(merged), MERGED_SOURCE, np.where(shares.derived, "derived", c.device_s_source))
    metered = c.energy_j * fraction
    energy = np.where(np.isnan(metered), shares.energy_j, metered)
    failed = np.where(c.ok, failed_part(c), 1.0)
    tokens = np.where(c.ok, c.output_tokens * fraction, 0.0)
    found = Usage(
        c, fraction, shares.device_s, shares.device_s * failed, 1.0 - failed, tokens, energy,
        shares.derived | ~np.isnan(merged), sources, shares.concurrency, shares, samples,
    )  # fmt: skip
    return found if filters == scope else _narrowed(found)


def failed_part(c: RequestColumns) -> np.ndarray:
    """Of each ok request's device time, the failed attempts' part: measured (failed_device_s / device_s)
    where the record carries it, else k/(k+1) for k retries."""
    assumed = c.retries / (c.retries + 1.0)
    known = ~np.isnan(c.failed_device_s) & (c.device_s > 0)
    measured = np.clip(np.nan_to_num(c.failed_device_s) / np.where(known, c.device_s, 1.0), 0.0, 1.0)
    return np.where(known, measured, assumed)


def retry_split(c: RequestColumns) -> tuple[int, int]:
    """(retried requests whose failed attempts were measured, those whose split is assumed)."""
    retried = c.ok & (c.retries > 0)
    known = retried & ~np.isnan(c.failed_device_s)
    return int(known.sum()), int((retried & ~known).sum())


def _narrowed(u: Usage) -> Usage:
    """The view's requests only; per instance, the device time and energy of the others (`outside`)."""
    view, names = u.columns.in_view, u.columns.instance
    outside = {
        name: (float(u.device_s[rows].sum()), float(np.nansum(u.energy_j[rows])))
        for name in set(names.tolist())
        for rows in [(names == name) & ~view]
    }
    per_row = ("fraction", "device_s", "failed_s", "ok_part", "tokens", "energy_j", "derived", "sources", "concurrency")
    return replace(u, columns=u.columns.take(view), outside=outside, **{f: getattr(u, f)[view] for f in per_row})


def _life(started_at: np.ndarray, queue_s: np.ndarray, e2e_s: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(start, end) of each request's time on the device: after its queue, up to its last token."""
    start = started_at + queue_s
    return start, np.maximum(started_at + e2e_s, start)


def _merged_sharing(db: Engine, window: Window, filters: Filters, c: RequestColumns, lo, hi) -> np.ndarray:
    """Gateway records' device time in [lo, hi] shared over every gateway's records at their upstream
    where more than one gateway reported it (cost.sharing); NaN: the record's own stands. Unless only
    the instance is filtered, everyone in flight there is read again, whatever the filters."""
    rows = np.flatnonzero(c.device_s_source == GATEWAY_SOURCE)
    found = np.full(len(c), np.nan)
    if not len(rows):
        return found
    if filters == Filters(instance=filters.instance):  # every record overlapping the window was read
        lives = Lives(c.instance[rows], c.gateway[rows], *(t[rows] for t in _life(c.started_at, c.queue_s, c.e2e_s)))
    else:
        read = gateway_lives(db, window, sorted(set(c.instance[rows].tolist())))
        lives = Lives(read.instance, read.gateway, *_life(read.started_at, read.queue_s, read.e2e_s))
    found[rows] = merged_device_s(lives, c.instance[rows], lo[rows], hi[rows])
    return found


def measured_inputs(
    db: Engine,
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
    incidents: IncidentHistory | None = None,
    usage: Usage | None = None,
    fleet: Fleet | None = None,
    per_instance: bool = False,
) -> CostInputs:
    """CostInputs from the requests, device samples, events and alert history stored in `window`
    (module docstring). Every instance is priced as `gpu_type` unless `per_instance`: then each as its
    `fleet` entry or device samples name it (`gpu_type` where nothing does). Monitoring storage is
    measured from the store when `measure_storage` and it holds records; incident time is derived from
    `incidents`, the alert history the caller read (`alerts.store.incident_history`: cost sits below
    alerts and never reads their tables)."""
    u = usage or read_usage(db, window, filters)
    c = u.columns
    prices.accelerator(gpu_type)  # ValueError: unknown GPU type
    memory = memory_rows(db, window, filters)
    names = {*c.instance.tolist(), *(i.name for i in u.attribution.instances), *(row[0] for row in memory)}
    devices = pick_devices(db, window, prices, names, DeviceChoice(gpu_type, fleet, per_instance), filters)
    target, draft, memory_source = _memory(memory, db, window, filters)
    first_at = float(c.started_at.min()) if len(c) else window.start
    window_s = max(window.end - max(window.start, first_at), 1e-9)
    power_source = ",".join(sorted({s.source for s in u.samples if s.source and s.power_w is not None})) or None
    keys = u.arm_keys
    arms = tuple(
        _measure(key, np.flatnonzero(keys == key), u, window_s, target, draft, memory_source, power_source)
        for key in sorted(set(keys.tolist()), key=lambda k: (k != "autoregressive", k))
        if _serves(np.flatnonzero(keys == key), u)
    )
    instances = _instances(u, keys, shares(memory, devices, _capacity(prices, gpu_count, gpu_memory_bytes)))
    return CostInputs(
        arms,
        prices,
        gpu_type,
        gpu_count,
        gpu_memory_bytes,
        None,
        _measured_hidden(db, window, hidden, measure_storage, incidents),
        pricing,
        _idle_time(instances),
        idle_allocation,
        instances,
        _step_times(u, keys),
        tuple(step_curves(db, window, sorted(set(c.instance.tolist()))).values()),
        devices,
        retry_split(c),
    )


def _capacity(prices: Prices, gpu_count: int, gpu_memory_bytes: float | None) -> Callable[[Device], float]:
    """Device -> the memory of its GPUs (given per GPU, else the price table's)."""
    return lambda d: (d.gpu_count or gpu_count) * (gpu_memory_bytes or prices.accelerator(d.gpu_type).memory_gb * GB)


def _serves(rows: np.ndarray, u: Usage) -> bool:
    ok = u.device_s[rows] - u.failed_s[rows]
    return ok.sum() > 0 and u.tokens[rows].sum() > 0


def _measure(key, rows, u: Usage, window_s, target, draft, memory_source, power_source) -> ModeMeasure:
    c = u.columns
    mode, _, drafter = key.partition(":")
    ok = rows[c.ok[rows]]
    tokens = float(u.tokens[rows].sum())
    device_s = float((u.device_s[rows] - u.failed_s[rows]).sum())
    energy, source = _energy(ok, u, power_source)
    draft_bytes, arm_memory_source = _draft_memory(drafter or None, draft, memory_source)
    return ModeMeasure(
        mode, drafter or None, len(ok), int(round(tokens)), window_s, tokens / device_s, energy, source,
        int(c.retries[rows].sum()), target, draft_bytes, arm_memory_source,
        int(c.drafts[ok].sum()), int(c.draft_tokens[ok].sum()), int(c.accepted_tokens[ok].sum()),
        float((c.draft_s[ok] * u.fraction[ok]).sum()), float((c.verify_s[ok] * u.fraction[ok]).sum()),
        device_s, float(u.failed_s[rows].sum()), _device_source(rows, u),
    )  # fmt: skip


def _device_source(rows: np.ndarray, u: Usage) -> str:
    """engine | processor_sharing | derived (none recorded: processor sharing here) | gateway_ps_merged
    (processor sharing over several gateways' records) | a mix, joined."""
    return ",".join(sorted({s or "derived" for s in u.sources[rows].tolist()}))


def _energy(ok: np.ndarray, u: Usage, power_source: str | None) -> tuple[float | None, str | None]:
    """J per ok token over the ok requests whose energy is known (metered, or attributed from a reading)."""
    c = u.columns
    covered = ok[~np.isnan(u.energy_j[ok])]
    tokens = u.tokens[covered].sum()
    if tokens <= 0:
        return None, None
    metered = ~np.isnan(c.energy_j[covered])
    sources = {s for s in c.energy_source[covered[metered]].tolist() if s}
    if not metered.all() and power_source:
        sources |= set(power_source.split(","))
    joules = (u.energy_j[covered] * u.ok_part[covered]).sum()
    return float(joules / tokens), ",".join(sorted(sources)) or None


def _step_times(u: Usage, keys: np.ndarray) -> tuple[StepTime, ...]:
    """Per (level of the request's mean concurrency, arm): ok requests' forwards, verify and draft time."""
    c = u.columns
    at = levels(u.concurrency)
    found = []
    for level, key in sorted({(int(a), k) for a, k, ok in zip(at, keys.tolist(), c.ok) if ok}):
        rows = np.flatnonzero(c.ok & (at == level) & (keys == key))
        forwards = np.maximum(c.output_tokens[rows] - 1 - c.accepted_tokens[rows], 0).sum()
        sums = (c.verify_s[rows].sum(), c.drafts[rows].sum(), c.draft_tokens[rows].sum(), c.draft_s[rows].sum())
        found.append(StepTime(level, key, int(forwards), float(sums[0]), int(sums[1]), int(sums[2]), float(sums[3])))
    return tuple(found)


def _instances(u: Usage, keys: np.ndarray, shares: dict) -> tuple[InstanceUse, ...]:
    by_name = {i.name: i for i in u.attribution.instances}
    rows: dict[str, dict[str, list[int]]] = defaultdict(lambda: defaultdict(list))
    for index, (name, key) in enumerate(zip(u.columns.instance.tolist(), keys.tolist())):
        rows[name][key].append(index)
    found = []
    for name in sorted(set(rows) | set(by_name)):
        uses = tuple(_use(key, np.asarray(idx), u) for key, idx in sorted(rows[name].items()))
        share, source = shares.get(name, (1.0, "whole device (memory not measured)"))
        instance = by_name.get(name)
        up, energy = (instance.up_s, instance.energy_j) if instance else (None, None)
        outside = None if u.outside is None else u.outside.get(name, (0.0, 0.0))
        found.append(InstanceUse(name, up, uses, share, source, energy, *(outside or (None, 0.0))))
    return tuple(found)


def _use(key: str, rows: np.ndarray, u: Usage) -> ArmUse:
    ok = rows[u.columns.ok[rows]]
    energy = u.energy_j[rows]
    known = ~np.isnan(energy)
    part = u.ok_part[rows]
    ok_j = float(np.sum(energy[known] * part[known])) if (known & u.columns.ok[rows]).any() else None
    failed_j = float(np.sum(energy[known] * (1 - part[known]))) if known.any() else None
    return ArmUse(
        key,
        float((u.device_s[rows] - u.failed_s[rows]).sum()),
        float(u.failed_s[rows].sum()),
        int(round(float(u.tokens[ok].sum()))),
        ok_j,
        failed_j,
        bool(u.derived[rows].any()),
    )


def _idle_time(instances: tuple[InstanceUse, ...]) -> IdleTime | None:
    sampled = [i for i in instances if i.up_s is not None]
    if not sampled:
        return None
    joules = [i.idle_energy_j for i in sampled]
    energy = None if any(j is None for j in joules) else sum(joules)
    return IdleTime(sum(i.billed_s for i in sampled), sum(i.busy_s for i in sampled), energy)


def _memory(rows: list[tuple], db: Engine, window: Window, filters: Filters):
    """(target bytes, draft bytes or None, source): medians of mem_reserved_bytes in the window."""
    if not rows:
        return None, None, "unmeasured"
    loaded = [r for _, r, is_loaded in rows if is_loaded is not False] or [r for _, r, _ in rows]
    plain = [r for _, r, is_loaded in rows if is_loaded is False]
    held = statistics.median(loaded)
    if plain:
        target = statistics.median(plain)
        return target, max(0.0, held - target), "measured"
    freed = [f for f in map(_freed, freed_by_unloads(db, window, filters)) if f is not None and f > 0]
    if freed:
        return max(0.0, held - statistics.median(freed)), statistics.median(freed), "measured"
    return held, None, "measured"


def _freed(detail: dict) -> float | None:
    before, after = detail.get("before") or {}, detail.get("after") or {}
    if isinstance(before.get("reserved"), (int, float)) and isinstance(after.get("reserved"), (int, float)):
        return float(before["reserved"] - after["reserved"])
    freed = detail.get("freed_rss_bytes")
    return float(freed) if isinstance(freed, (int, float)) else None


def _draft_memory(drafter: str | None, draft: float | None, memory_source: str) -> tuple[float, str]:
    """Plain decoding holds no draft; n-gram lookup holds no weights; a model draft what was measured."""
    if drafter is None or drafter == "ngram":
        return 0.0, memory_source
    if draft is None:
        return 0.0, "draft not separated from target" if memory_source != "unmeasured" else memory_source
    return draft, memory_source


def _measured_hidden(db: Engine, window: Window, hidden: HiddenCosts, storage: bool, incidents: IncidentHistory | None):
    given = hidden.source("monitoring_gb_per_day") == "given"  # a value the user gave wins over the store's
    growth = storage_gb_per_day(db, window) if storage and not given else None
    if growth is not None:
        hidden = hidden.with_values("measured", monitoring_gb_per_day=growth)
    if incidents is not None:
        hidden = hidden.with_values("measured (alert history)", incident_days_per_week=incident_days(incidents, window))
    return hidden


INCIDENT_ACTION_HOURS = 0.5


class IncidentHistory(Protocol):
    """The alert history incident time is estimated from (`alerts.store.IncidentHistory` is one)."""

    transitions: tuple[tuple[str, float, str], ...]  # (fingerprint, at, to_state) up to the window's end, oldest first
    actions: int  # remediation actions inside the window


def incident_days(history: IncidentHistory, window: Window) -> float:
    """Person-days per week spent on incidents, from the alert history: one engineer per firing alert
    for as long as it fired, plus INCIDENT_ACTION_HOURS per remediation, at 8 hours a day."""
    hours = _firing_seconds(history.transitions, window) / 3600 + INCIDENT_ACTION_HOURS * history.actions
    return hours / 8 / (max(window.seconds, 3600.0) / (7 * 86400))


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


def storage_gb_per_day(db: Engine, window: Window) -> float | None:
    """Store growth: database bytes per stored record x records stored per day in the window
    (None when the store is empty or its size cannot be read)."""
    growth = store_growth(db, window)
    if not growth.total_rows or not growth.size_bytes or growth.first_at is None:
        return None
    days = max(window.end - max(window.start, growth.first_at), 3600.0) / 86400
    return growth.window_rows * growth.size_bytes / growth.total_rows / days / GB
