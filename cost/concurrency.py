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

The crossover (`crossover`, the one definition the API, the Cost page, the report and the xlsx
show): the lowest level, among those where both modes have enough data, from which speculation
costs more at every such level above. `best_within_slo`: per mode, the $ per 1M tokens at the
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


@dataclass(frozen=True)
class ConcurrencyCosts:
    rows: tuple[ConcurrencyRow, ...]
    crossover: int | None  # lowest level from which speculation costs more than plain (None: never)
    gpu_hour_usd: float  # the inputs' GPU type's price (each instance is charged at its own: its bill's rate)
    rules: BinRules = BinRules()
    service: ServiceRules = ServiceRules()
    best_within_slo: tuple[tuple[str, int, float], ...] = ()  # (mode, level, $ per 1M tokens)
    binning: str = "time-weighted concurrency over each request's life"

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
    charge = request_charges(inputs, u)
    gpus = gpu_counts(inputs, u)
    rows = []
    for j, level in enumerate(seen.tolist()):
        for mode in ("autoregressive", "speculative"):
            picked = np.flatnonzero((c.mode == mode) & (fractions[:, j] > 0))
            if len(picked) and u.tokens[picked].sum() > 0:
                rows.append(
                    _row(
                        level,
                        mode,
                        picked,
                        fractions[:, j],
                        fractions.argmax(axis=1) == j,
                        u,
                        charge,
                        gpus,
                        rules,
                        service,
                    )
                )
    rows = tuple(sorted(rows, key=lambda row: (row.level, row.mode)))
    return ConcurrencyCosts(rows, crossover(rows), inputs.gpu_hour_usd, rules, service, best_within_slo(rows))


def _clipped_life(u: Usage, window: Window) -> tuple[np.ndarray, np.ndarray]:
    c = u.columns
    start = np.maximum(c.started_at + c.queue_s, window.start)
    end = np.minimum(np.maximum(c.started_at + c.e2e_s, c.started_at + c.queue_s), window.end)
    return np.minimum(start, end), np.maximum(end, start)


def _row(level, mode, picked, weight, dominant, u: Usage, charge, gpus, rules: BinRules, service) -> ConcurrencyRow:
    c, w = u.columns, weight[picked]
    usd, tokens = charge[picked] * w, u.tokens[picked] * w
    device_s = float((u.device_s[picked] * w).sum())
    drafted, accepted = (c.draft_tokens[picked] * w).sum(), (c.accepted_tokens[picked] * w).sum()
    enough = w.sum() >= rules.min_requests and tokens.sum() >= rules.min_tokens
    low, high = _interval(usd, tokens, rules.resamples) if enough else (None, None)
    ttft, tpot = _latency(u, picked[dominant[picked] & c.ok[picked]])
    meets = None if ttft is None else ttft <= service.ttft_p99_s and (tpot is None or tpot <= service.tpot_p99_s)
    return ConcurrencyRow(
        int(level), mode, float(w.sum()), float(tokens.sum()), device_s,
        float((gpus[picked] * u.device_s[picked] * w).sum() / 3600 * MTOK / tokens.sum()),
        float(usd.sum() / tokens.sum() * MTOK),
        ratios.acceptance_rate(accepted, drafted), bool(enough), low, high, ttft, tpot, meets,
    )  # fmt: skip


def _interval(usd: np.ndarray, tokens: np.ndarray, resamples: int) -> tuple[float | None, float | None]:
    """95% percentile bootstrap of Σ usd / Σ tokens x 1e6 over the requests (scipy)."""
    if resamples <= 0 or len(usd) < 2:
        return None, None
    from scipy.stats import bootstrap

    def ratio(a, b, axis=-1):
        return a.sum(axis=axis) / np.maximum(b.sum(axis=axis), 1e-300) * MTOK

    found = bootstrap(
        (usd, tokens), ratio, paired=True, vectorized=True, n_resamples=resamples, method="percentile", random_state=0
    )
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


def crossover(rows: tuple[ConcurrencyRow, ...]) -> int | None:
    """The lowest level where both modes have enough data from which speculation costs more at every
    such level above (the one definition every view shows)."""
    cost: dict[int, dict[str, float]] = defaultdict(dict)
    for row in rows:
        if row.enough:
            cost[row.level][row.mode] = row.usd_per_mtok
    both = sorted(at for at, modes in cost.items() if len(modes) == 2)
    dearer = [cost[at]["speculative"] > cost[at]["autoregressive"] for at in both]
    return next((at for i, at in enumerate(both) if all(dearer[i:])), None)


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
