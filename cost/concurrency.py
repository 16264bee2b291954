"""Cost per 1M output tokens against concurrency, speculative vs plain, and the one crossover.

Speculation's payoff shrinks as concurrency rises: a batched forward is shared by more requests,
so the verify rows a draft adds take room that other requests' tokens would have used.

Binning: each request's life is split over the concurrency levels it ran at (the power of two
nearest the number of requests in flight on its instance, moment by moment: time-weighted), and
its charge and tokens go to each level in that proportion. Its charge is what the allocation
(`cost.allocation`) charges its device time: the deployment's share x the instance's $/s x its
device seconds (ok and failed work), its energy on-prem, and the idle time the allocation gives its
arm in proportion to its device time. So per mode, Σ over levels = the TCO table's arm figures,
and the levels use the same $ per device-second as the bill.

A (level, mode) needs `BinRules.min_requests` requests (Σ of their fractions) and `min_tokens`
tokens, or it is listed as too small and takes no part in the crossover; its 95% bootstrap
interval (scipy, requests resampled) is given with it.

The crossover (`crossing`, the one definition the API, the Cost page, the report and the xlsx
show) is found per group, a drafter on a GPU type against plain decoding on that GPU type (`groups`):
the lowest level, among those where both modes have enough data, from which speculation costs more at
every such level above, "more" meaning that its 95% interval lies above plain's (`Crossover.levels` says
per level: cheaper, dearer, or overlap). Where intervals overlap at a level above every dearer one, no
crossover is stated and `Crossover.reason` says why. `ConcurrencyCosts.crossover` is that of the group
that served the most speculative tokens (the verdict's knee); `rows` pool every group, for the table.
Each group is calibrated (`cost.calibration`): the per-request model at each level, beside the measured
ratio. `best_within_slo`: per mode, the $ per 1M tokens at the
highest level whose TTFT and TPOT p99 (of the requests that spent most of their life there) meet
`ServiceRules`.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
from sqlalchemy import Engine

from specwatch.collector.reads.queries import Filters, Window
from specwatch.cost.allocation import Allocation, allocate
from specwatch.cost.attribution import Spans, level_fractions
from specwatch.cost.calibration import LevelCheck, calibrate
from specwatch.cost.measured import Usage, read_usage
from specwatch.cost.model import MTOK, CostInputs
from specwatch.telemetry import ratios


@dataclass(frozen=True)
class BinRules:
    min_requests: float = 5.0  # requests (Σ of the fractions of their lives) per level and mode
    min_tokens: float = 200.0
    resamples: int = 400  # bootstrap resamples per level and mode (0: no interval)


@dataclass(frozen=True)
class ServiceRules:
    """The latency a load level must meet to count as served (p99 over its requests)."""

    ttft_p99_s: float = 0.3  # the TTFTP99High rule's threshold
    tpot_p99_s: float = 0.2


@dataclass(frozen=True)
class ConcurrencyRow:
    level: int
    mode: str  # speculative | autoregressive
    requests: float  # Σ of the fractions of their lives spent at this level
    output_tokens: float
    device_s: float
    gpu_hours_per_mtok: float
    usd_per_mtok: float
    acceptance_rate: float | None  # accepted / drafted tokens (speculative rows)
    enough: bool = True  # meets BinRules; False: shown, not used for the crossover
    usd_low: float | None = None  # 95% bootstrap interval of usd_per_mtok
    usd_high: float | None = None
    ttft_p99_s: float | None = None
    tpot_p99_s: float | None = None
    meets_slo: bool | None = None
    # Σ over the level's requests of each one's fraction of life there x its: (the calibration's inputs)
    drafts: float = 0.0
    draft_tokens: float = 0.0
    accepted_tokens: float = 0.0
    draft_s: float = 0.0
    e2e_s: float = 0.0  # of ok requests, beside `ok_tokens`: latency per token
    ok_tokens: float = 0.0
    verify_s: float = 0.0  # whole target forwards the requests were in, beside `forwards` (their count)
    forwards: float = 0.0  # target forwards after the prefill: output tokens - 1 - accepted


@dataclass(frozen=True)
class Crossover:
    """Where one drafter on one GPU type starts to cost more per token than plain decoding there."""

    gpu_type: str
    drafter: str | None
    level: int | None  # None: no crossover (`reason` says why)
    reason: str
    levels: tuple[tuple[int, str], ...] = ()  # (level, cheaper | dearer | overlap) where both modes have enough


@dataclass(frozen=True)
class GroupCosts:
    """One drafter on one GPU type, with plain decoding on that GPU type: its rows, crossover and calibration."""

    gpu_type: str
    drafter: str | None
    rows: tuple[ConcurrencyRow, ...]
    crossover: Crossover
    calibration: tuple[LevelCheck, ...] = ()  # per level with both modes
    speculative_tokens: float = 0.0


@dataclass(frozen=True)
class ConcurrencyCosts:
    rows: tuple[ConcurrencyRow, ...]  # every group pooled
    crossover: int | None  # the main group's: lowest level from which speculation costs more (None: not stated)
    gpu_hour_usd: float  # the inputs' GPU type's price (each instance is charged at its own: its bill's rate)
    rules: BinRules = BinRules()
    service: ServiceRules = ServiceRules()
    best_within_slo: tuple[tuple[str, int, float], ...] = ()  # (mode, level, $ per 1M tokens)
    binning: str = "time-weighted concurrency over each request's life"
    groups: tuple[GroupCosts, ...] = ()

    @property
    def main(self) -> GroupCosts | None:
        """The group that served the most speculative tokens (the verdict's)."""
        return max(self.groups, key=lambda g: g.speculative_tokens, default=None)

    @property
    def crossover_reason(self) -> str:
        main = self.main
        return main.crossover.reason if main else "no level has both speculative and plain requests"

    def speedup(self, at_level: int) -> float | None:
        """Plain cost / speculative cost at a level (> 1: speculation is cheaper); None without both."""
        found = {row.mode: row for row in self.rows if row.level == at_level}
        spec, plain = found.get("speculative"), found.get("autoregressive")
        return plain.usd_per_mtok / spec.usd_per_mtok if spec and plain and spec.usd_per_mtok > 0 else None


def request_charges(inputs: CostInputs, usage: Usage, allocation: Allocation | None = None) -> np.ndarray:
    """Each request's $ under the allocation: its device time at its instance's rate (that instance's bill)
    x share, its energy when added there, and its arm's idle on that instance in proportion to its device
    time."""
    allocation = allocation or allocate(inputs)
    keys, names = usage.arm_keys, usage.columns.instance
    kwh_usd = inputs.prices.pue * inputs.prices.electricity_usd_per_kwh / 3.6e6
    charge = np.zeros(len(keys))
    for instance, bill in zip(inputs.usage, allocation.bills):
        rows = names == instance.name
        usd_per_j = kwh_usd if inputs.device(instance.name).energy_added else 0.0
        energy = np.nan_to_num(usage.energy_j[rows]) * usd_per_j
        charge[rows] = instance.share * (usage.device_s[rows] * bill.usd_per_s + energy)
        for use in instance.arms:
            idle = sum(
                x.usd for x in allocation.lines if x.instance == instance.name and x.kind == "idle" and x.arm == use.arm
            )
            picked = rows & (keys == use.arm)
            busy = use.device_s + use.failed_device_s
            if idle and busy > 0:
                charge[picked] += idle * usage.device_s[picked] / busy
    return charge


def gpu_counts(inputs: CostInputs, usage: Usage) -> np.ndarray:
    """Each request's instance's GPUs."""
    counts = {i.name: inputs.device(i.name).gpu_count or 1 for i in inputs.usage}
    return np.array([counts.get(name, inputs.gpu_count) for name in usage.columns.instance.tolist()], dtype=float)


def concurrency_costs(
    db: Engine,
    window: Window,
    inputs: CostInputs,
    *,
    filters: Filters = Filters(),
    usage: Usage | None = None,
    rules: BinRules = BinRules(),
    service: ServiceRules = ServiceRules(),
) -> ConcurrencyCosts:
    """Rows per (level, mode) over the requests of `window`, priced like `inputs` (module docstring)."""
    u = usage or read_usage(db, window, filters)
    c = u.columns
    spans = Spans(c.instance, *_clipped_life(u, window), u.device_s)
    seen, fractions = level_fractions(spans)
    charge, gpus = request_charges(inputs, u), gpu_counts(inputs, u)
    binned = Binned(u, seen, fractions, charge, gpus, _gpu_types(inputs, u), rules, service)
    rows = binned.rows(np.ones(len(c), dtype=bool))
    groups = tuple(_group(binned, inputs, gpu, drafter) for gpu, drafter in _group_keys(binned))
    main = max(groups, key=lambda g: g.speculative_tokens, default=None)
    return ConcurrencyCosts(
        rows,
        main.crossover.level if main else None,
        inputs.gpu_hour_usd,
        rules,
        service,
        best_within_slo(rows),
        groups=groups,
    )


@dataclass(frozen=True)
class Binned:
    """The window's requests spread over concurrency levels, charged: what rows are built from."""

    u: Usage
    levels: np.ndarray
    fractions: np.ndarray  # request x level
    charge: np.ndarray
    gpus: np.ndarray  # each request's instance's GPU count
    gpu_types: np.ndarray  # and its GPU type
    rules: BinRules
    service: ServiceRules

    def rows(self, among: np.ndarray) -> tuple[ConcurrencyRow, ...]:
        """Rows per (level, mode) over the requests `among` selects."""
        c, found = self.u.columns, []
        dominant = self.fractions.argmax(axis=1) if len(c) else np.zeros(0, dtype=int)
        for j, level in enumerate(self.levels.tolist()):
            for mode in ("autoregressive", "speculative"):
                picked = np.flatnonzero(among & (c.mode == mode) & (self.fractions[:, j] > 0))
                if len(picked) and self.u.tokens[picked].sum() > 0:
                    found.append(_row(level, mode, picked, self.fractions[:, j], dominant == j, self))
        return tuple(sorted(found, key=lambda row: (row.level, row.mode)))


def _group_keys(binned: Binned) -> list[tuple[str, str | None]]:
    """(GPU type, drafter) of every speculative request, ordered."""
    c = binned.u.columns
    spec = c.mode == "speculative"
    return sorted({(t, d) for t, d in zip(binned.gpu_types[spec].tolist(), c.drafter[spec].tolist())}, key=str)


def _gpu_types(inputs: CostInputs, u: Usage) -> np.ndarray:
    names = {i.name: inputs.device(i.name).gpu_type for i in inputs.usage}
    return np.array([names.get(n, inputs.gpu_type) for n in u.columns.instance.tolist()], dtype=object)


def _group(binned: Binned, inputs: CostInputs, gpu_type: str, drafter: str | None) -> GroupCosts:
    c = binned.u.columns
    on_gpu = binned.gpu_types == gpu_type
    spec = on_gpu & (c.mode == "speculative") & (c.drafter == drafter)
    rows = binned.rows(spec | (on_gpu & (c.mode == "autoregressive")))
    found = crossing(rows, gpu_type, drafter)
    tokens = float(binned.u.tokens[spec].sum())
    curves = [curve for curve in inputs.step_curves if inputs.device(curve.instance).gpu_type == gpu_type]
    return GroupCosts(gpu_type, drafter, rows, found, calibrate(rows, curves), tokens)


def _clipped_life(u: Usage, window: Window) -> tuple[np.ndarray, np.ndarray]:
    c = u.columns
    start = np.maximum(c.started_at + c.queue_s, window.start)
    end = np.minimum(np.maximum(c.started_at + c.e2e_s, c.started_at + c.queue_s), window.end)
    return np.minimum(start, end), np.maximum(end, start)


def _row(level, mode, picked, weight, dominant, binned: Binned) -> ConcurrencyRow:
    u, rules, service = binned.u, binned.rules, binned.service
    c, w = u.columns, weight[picked]
    usd, tokens = binned.charge[picked] * w, u.tokens[picked] * w
    device_s = float((u.device_s[picked] * w).sum())
    drafted, accepted = (c.draft_tokens[picked] * w).sum(), (c.accepted_tokens[picked] * w).sum()
    enough = w.sum() >= rules.min_requests and tokens.sum() >= rules.min_tokens
    low, high = _interval(usd, tokens, rules.resamples) if enough else (None, None)
    ttft, tpot = _latency(u, picked[dominant[picked] & c.ok[picked]])
    meets = None if ttft is None else ttft <= service.ttft_p99_s and (tpot is None or tpot <= service.tpot_p99_s)
    ok = c.ok[picked]
    return ConcurrencyRow(
        int(level), mode, float(w.sum()), float(tokens.sum()), device_s,
        float((binned.gpus[picked] * u.device_s[picked] * w).sum() / 3600 * MTOK / tokens.sum()),
        float(usd.sum() / tokens.sum() * MTOK),
        ratios.acceptance_rate(accepted, drafted), bool(enough), low, high, ttft, tpot, meets,
        float((c.drafts[picked] * w).sum()), float(drafted), float(accepted),
        float((c.draft_s[picked] * w).sum()), float((c.e2e_s[picked] * w)[ok].sum()), float(tokens[ok].sum()),
        float((c.verify_s[picked] * w).sum()),
        float((np.maximum(c.output_tokens[picked] - 1 - c.accepted_tokens[picked], 0) * w).sum()),
    )  # fmt: skip


def _interval(usd: np.ndarray, tokens: np.ndarray, resamples: int) -> tuple[float | None, float | None]:
    """95% percentile bootstrap of Σ usd / Σ tokens x 1e6 over the requests (scipy)."""
    if resamples <= 0 or len(usd) < 2:
        return None, None
    from scipy.stats import bootstrap

    def ratio(a, b, axis=-1):
        tokens = b.sum(axis=axis)  # a resample of failed requests only has none: no $ per token (inf)
        return np.where(tokens > 0, a.sum(axis=axis) / np.where(tokens > 0, tokens, 1.0) * MTOK, np.inf)

    with np.errstate(invalid="ignore", over="ignore"):  # scipy's standard error over an inf resample
        found = bootstrap(
            (usd, tokens), ratio, paired=True, vectorized=True, n_resamples=resamples, method="percentile",
            random_state=0,
        )  # fmt: skip
    return float(found.confidence_interval.low), float(found.confidence_interval.high)


def _latency(u: Usage, rows: np.ndarray) -> tuple[float | None, float | None]:
    """TTFT and TPOT p99 of these requests ((e2e - ttft) / (output - 1) per request)."""
    c = u.columns
    ttft = c.ttft_s[rows]
    ttft = ttft[~np.isnan(ttft)]
    if not len(ttft):
        return None, None
    many = rows[(c.output_tokens[rows] > 1) & ~np.isnan(c.ttft_s[rows])]
    tpot = (c.e2e_s[many] - c.ttft_s[many]) / (c.output_tokens[many] - 1)
    return float(np.quantile(ttft, 0.99)), float(np.quantile(tpot, 0.99)) if len(tpot) else None


def crossing(rows: tuple[ConcurrencyRow, ...], gpu_type: str = "", drafter: str | None = None) -> Crossover:
    """The crossover of one group's rows (module docstring): per level where both modes have enough data,
    speculation is cheaper or dearer when its interval clears plain's (the point figures where a row has no
    interval), else the two overlap."""
    at: dict[int, dict[str, ConcurrencyRow]] = defaultdict(dict)
    for row in rows:
        if row.enough:
            at[row.level][row.mode] = row
    levels = tuple((lv, _compare(at[lv])) for lv in sorted(at) if len(at[lv]) == 2)
    if not levels:
        return Crossover(gpu_type, drafter, None, "no level has enough speculative and plain requests to compare")
    verdicts = [v for _, v in levels]
    found = next((lv for i, (lv, _) in enumerate(levels) if all(v == "dearer" for v in verdicts[i:])), None)
    if found is not None:
        return Crossover(gpu_type, drafter, found, f"speculation costs more per token from level {found}", levels)
    overlap = [lv for lv, v in levels if v == "overlap"]
    if overlap and verdicts[-1] != "cheaper":
        why = f"no crossover: the intervals overlap at level(s) {', '.join(map(str, overlap))}"
    else:
        why = "no crossover: speculation costs no more than plain decoding at the highest level measured"
    return Crossover(gpu_type, drafter, None, why, levels)


def _compare(modes: dict[str, ConcurrencyRow]) -> str:
    spec, plain = modes["speculative"], modes["autoregressive"]
    if None in (spec.usd_low, spec.usd_high, plain.usd_low, plain.usd_high):
        return "dearer" if spec.usd_per_mtok > plain.usd_per_mtok else "cheaper"
    if spec.usd_low > plain.usd_high:
        return "dearer"
    return "cheaper" if spec.usd_high < plain.usd_low else "overlap"


def best_within_slo(rows: tuple[ConcurrencyRow, ...]) -> tuple[tuple[str, int, float], ...]:
    """Per mode: (mode, level, $ per 1M tokens) at the highest level with enough data that meets the rules."""
    found = []
    for mode in ("autoregressive", "speculative"):
        meeting = [r for r in rows if r.mode == mode and r.enough and r.meets_slo]
        if meeting:
            top = max(meeting, key=lambda r: r.level)
            found.append((mode, top.level, top.usd_per_mtok))
    return tuple(found)


def concurrency_costs_at(
    db: Engine, window: Window, prices, *, gpu_type: str, gpu_count: int = 1, filters: Filters = Filters()
) -> ConcurrencyCosts:
    """`concurrency_costs` of the store's `window` measured and priced on `gpu_type` (bench/cost.py)."""
    from specwatch.cost.measured import measured_inputs

    usage = read_usage(db, window, filters)
    priced = dict(gpu_type=gpu_type, gpu_count=gpu_count, filters=filters, measure_storage=False, usage=usage)
    inputs = measured_inputs(db, window, prices, **priced)
    return concurrency_costs(db, window, inputs, filters=filters, usage=usage)
