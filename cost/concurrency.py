"""Cost per 1M output tokens against concurrency, speculative vs plain, and where they cross.

Speculation's payoff shrinks as concurrency rises: a batched forward is shared by more requests,
so the verify rows a draft adds take room that other requests' tokens would have used. Each
request is put at the concurrency level it ran at (cost.attribution.level: the nearest power of
two to the mean number of requests in flight on its instance during its life); per level and
mode, cost per 1M tokens = Σ device_s (ok requests) x instance $/s x gpu_count / Σ ok tokens.
The crossover is the lowest level from which speculation costs more at every level above.
Memory share, energy and retries are left to the full model (`cost.model`): this is the
device-time core that changes with concurrency.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
from sqlalchemy import Engine

from collector.queries import Filters, Window
from cost.attribution import attribute, levels
from cost.inputs import power_samples, request_columns
from cost.model import MTOK, Prices


@dataclass(frozen=True)
class ConcurrencyRow:
    level: int
    mode: str  # speculative | autoregressive
    requests: int
    output_tokens: int
    device_s: float
    gpu_hours_per_mtok: float
    usd_per_mtok: float
    acceptance_rate: float | None  # accepted / drafted tokens (speculative rows)


@dataclass(frozen=True)
class ConcurrencyCosts:
    rows: tuple[ConcurrencyRow, ...]
    crossover: int | None  # lowest level from which speculation costs more than plain (None: never)
    gpu_hour_usd: float

    def speedup(self, at_level: int) -> float | None:
        """Plain cost / speculative cost at a level (> 1: speculation is cheaper); None without both."""
        found = {row.mode: row for row in self.rows if row.level == at_level}
        spec, plain = found.get("speculative"), found.get("autoregressive")
        return plain.usd_per_mtok / spec.usd_per_mtok if spec and plain and spec.usd_per_mtok > 0 else None


def concurrency_costs(
    engine: Engine,
    window: Window,
    prices: Prices,
    *,
    gpu_type: str,
    gpu_count: int = 1,
    pricing: str = "on-demand",
    filters: Filters = Filters(),
) -> ConcurrencyCosts:
    """Rows per (level, mode) over the requests stored in `window` (module docstring)."""
    gpu_hour = prices.accelerator(gpu_type).price(pricing)
    requests = request_columns(engine, window, filters)
    shares = attribute(requests.spans, power_samples(engine, window, filters))
    ok = np.flatnonzero(requests.ok)
    at_level = levels(shares.concurrency[ok])
    rows = []
    for at in np.unique(at_level).tolist():
        for mode in ("autoregressive", "speculative"):
            picked = ok[(at_level == at) & (requests.mode[ok] == mode)]
            tokens, device_s = requests.output_tokens[picked].sum(), shares.device_s[picked].sum()
            if tokens > 0 and device_s > 0:
                sums = (len(picked), tokens, device_s, requests.draft_tokens[picked].sum())
                accepted = requests.accepted_tokens[picked].sum()
                rows.append(_row(at, mode, *sums, accepted, gpu_hour=gpu_hour, gpu_count=gpu_count))
    rows = tuple(sorted(rows, key=lambda row: (row.level, row.mode)))
    return ConcurrencyCosts(rows, crossover(rows), gpu_hour)


def _row(at, mode, requests, tokens, device_s, drafted, accepted, *, gpu_hour, gpu_count) -> ConcurrencyRow:
    gpu_hours = gpu_count * device_s / 3600 * MTOK / tokens
    acceptance = accepted / drafted if drafted else None
    return ConcurrencyRow(
        int(at),
        mode,
        int(requests),
        int(tokens),
        float(device_s),
        float(gpu_hours),
        float(gpu_hours * gpu_hour),
        None if acceptance is None else float(acceptance),
    )


def crossover(rows: tuple[ConcurrencyRow, ...]) -> int | None:
    """The lowest level with both modes from which speculation costs more at every such level above."""
    cost = defaultdict(dict)
    for row in rows:
        cost[row.level][row.mode] = row.usd_per_mtok
    both = sorted(at for at, modes in cost.items() if len(modes) == 2)
    dearer = [cost[at]["speculative"] > cost[at]["autoregressive"] for at in both]
    for i, at in enumerate(both):
        if all(dearer[i:]):
            return at
    return None
