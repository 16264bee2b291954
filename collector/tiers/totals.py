"""One totals type for every tier of the read path, and the one `Signals` builder over it.

A `Totals` holds, for the requests of one group over a window, what every tier (raw rows, the
per-second aggregates, the per-minute and hourly rollups) can give in mergeable form: counts and
sums (`aggregates.COUNTS`, `aggregates.SUMS`; a rollup has no `cost_*` sums), the per-request
acceptance rate's M2 (sum of squared deviations, merged with Chan's formula), DDSketches of
TTFT, e2e and TPOT (`collector.tiers.sketch`), and the span of the requests' work.

The active span (`active_s`) is the time the work actually took, clipped to the window: from the first
request's start to the last one's finish (start + e2e), from raw rows and the per-second aggregates; from
the start of the first period to the end of the last from the minute and hourly rollups (whose periods
dwarf a request). Rates are per active second, so a run 4 minutes old in a one-hour window is rated over
its 4 minutes, not diluted over the hour, and the tokens a run makes after its last request started get
their time (issue 57: a span ending at the last start + 1 s rated a load stopping inside the window 18% high).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from specwatch.collector.reads.queries import Percentiles, Signals, Window, active_span
from specwatch.collector.tiers import sketch
from specwatch.collector.tiers.aggregates import COUNTS, SUMS

SKETCH_NAMES = ("ttft", "e2e", "tpot")
QUANTILES = (0.5, 0.9, 0.95, 0.99)


@dataclass(frozen=True)
class Totals:
    """One group's totals over a window (see the module doc)."""

    sums: dict[str, float]  # COUNTS and SUMS by name
    rate_m2: float = 0.0
    sketches: dict[str, sketch.Bins] = field(default_factory=dict)  # by "ttft", "e2e", "tpot" (those read)
    first_s: float = math.inf  # the first request's start (a rollup's: its first period's)
    last_s: float = -math.inf  # the last one's finish (a rollup's: the end of its last period)

    @property
    def requests(self) -> int:
        return int(self.sums.get("requests", 0))

    def acceptance_mean(self) -> float | None:
        n = self.sums["rate_n"]
        return self.sums["rate_sum"] / n if n else None

    def acceptance_stddev(self) -> float | None:
        """Population standard deviation (numpy's np.std) of the per-request acceptance rates."""
        n = self.sums["rate_n"]
        return math.sqrt(max(0.0, self.rate_m2 / n)) if n else None

    def active_s(self, window: Window) -> float:
        """Seconds of `window` from the first start to the last finish (the module doc)."""
        return active_span(window, self.first_s, self.last_s) if self.requests else 0.0

    def rate(self, name: str, window: Window) -> float:
        """`sums[name]` per active second (0 without requests)."""
        active = self.active_s(window)
        return self.sums.get(name, 0.0) / active if active > 0 else 0.0

    def percentiles(self, name: str) -> Percentiles:
        return percentiles(self.sketches.get(name, sketch.EMPTY))


EMPTY = Totals({name: 0.0 for name in (*COUNTS, *SUMS)}, 0.0, dict.fromkeys(SKETCH_NAMES, sketch.EMPTY))


def percentiles(bins: sketch.Bins) -> Percentiles:
    if not bins.count:
        return Percentiles()
    p50, p90, p95, p99 = (sketch.quantile(bins, q) for q in QUANTILES)
    return Percentiles(p50, p90, p95, p99, bins.count)


def ratio(num: float, den: float) -> float | None:
    return num / den if den else None


def draft_fields(totals: Totals) -> dict:
    """The draft counts and the acceptance derived from them, as `Signals` and `SeriesPoint` name them."""
    s = totals.sums
    return {
        "drafts": int(s["drafts"]),
        "draft_tokens": int(s["draft_tokens"]),
        "accepted_tokens": int(s["accepted_tokens"]),
        "acceptance_rate": ratio(s["accepted_tokens"], s["draft_tokens"]),
        "acceptance_rate_mean": totals.acceptance_mean(),
        "acceptance_rate_stddev": totals.acceptance_stddev(),
        "mean_acceptance_length": None if not s["drafts"] else 1.0 + s["accepted_tokens"] / s["drafts"],
    }


def signals_from(window: Window, totals: Totals) -> Signals:
    """The window's `Signals` from its totals (every tier; percentiles from the merged sketches)."""
    s = totals.sums
    return Signals(
        window=window,
        requests=totals.requests,
        errors=int(s["errors"]),
        ooms=int(s["ooms"]),
        output_tokens=int(s["output_tokens"]),
        active_s=totals.active_s(window),
        request_rate_per_s=totals.rate("requests", window),
        output_tokens_per_s=totals.rate("output_tokens", window),
        **draft_fields(totals),
        ttft=totals.percentiles("ttft"),
        e2e=totals.percentiles("e2e"),
        tpot=totals.percentiles("tpot"),
    )
