"""Which slices of each drafter's traffic lost acceptance, and which have captures to retrain on (issue 56).

A **slice** is one drafter and model, one tenant, one scenario tag and one prompt-length band
(`queries.LENGTH_EDGES`, the Acceptance page's prompt-length buckets, [low, high)). A request without a
tenant or scenario tag falls in the slice whose value is null (`none` in a capture filter).

For each slice: acceptance (accepted / drafted tokens) in the window ("now") against the baseline window
just before it, over the requests that drafted. The fall is tested as the deploy-marker regression detector
tests one (alerts/regression.py): a one-sided Mann-Whitney U test of per-request acceptance (now < before),
run only where each side holds `min_requests`. Many slices are tested at once, so some would pass p < alpha
by chance: the p-values are adjusted for the false discovery rate (Benjamini-Hochberg, scipy's
`false_discovery_control`), and a slice **lost acceptance** when its q-value < alpha and its pooled
acceptance fell.

A slice has a **retrain candidate** when its unexpired chat captures with an output (what
`specwatch draft export` writes for the slice) number at least `min_captures`. Counts only: no capture
text leaves this read.
"""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from dataclasses import dataclass

import numpy as np
from sqlalchemy import Engine, select

from specwatch.collector.captures import exportable_keys
from specwatch.collector.models import Request
from specwatch.collector.reads import reader
from specwatch.collector.reads.queries import LENGTH_EDGES, Filters, Subset, Window, sample_rows

Band = tuple[int, int | None]  # [low, high) prompt tokens; high None: unbounded
Key = tuple[str, str, str | None, str | None, int]  # drafter, model, tenant, scenario, band index
BANDS: tuple[Band, ...] = tuple(zip(LENGTH_EDGES, (*LENGTH_EDGES[1:], None)))


@dataclass(frozen=True)
class SliceSettings:
    alpha: float = 0.05  # the false discovery rate a lost slice is called at
    min_requests: int = 20  # on each side, to be tested
    min_captures: int = 16  # for a retrain candidate: `draft train` keeps 8 out by default, as many to train on
    limit: int = 100  # slices returned, lost ones first

    def __post_init__(self) -> None:
        if not 0 < self.alpha < 1 or self.min_requests < 2 or self.min_captures < 1 or self.limit < 1:
            raise ValueError("alpha must be in (0, 1), min_requests >= 2, min_captures >= 1, limit >= 1")


@dataclass(frozen=True)
class Side:
    requests: int
    acceptance_rate: float


@dataclass(frozen=True)
class AcceptanceSlice:
    drafter: str
    model: str
    tenant: str | None
    scenario: str | None
    prompt_tokens: Band
    before: Side
    now: Side
    p_value: float  # one-sided Mann-Whitney U, now < before
    q_value: float  # p adjusted for the slices tested together (Benjamini-Hochberg)
    lost: bool
    captures: int
    retrain_candidate: bool


@dataclass(frozen=True)
class SliceReport:
    window: Window
    baseline: Window
    settings: SliceSettings
    bands: tuple[Band, ...]
    tested: int
    untested: int  # slices with fewer than min_requests on a side
    lost: int
    slices: list[AcceptanceSlice]  # tested ones, lost first, then by q-value; at most settings.limit
    truncated: bool
    sampled_now: Subset | None = None
    sampled_before: Subset | None = None


def band_of(prompt_tokens: int) -> int:
    """The index in BANDS of the band holding `prompt_tokens`."""
    return max(0, int(np.searchsorted(LENGTH_EDGES, prompt_tokens, side="right")) - 1)


def baseline_before(window: Window, seconds: float | None = None) -> Window:
    """The baseline: `seconds` (default the window's length) ending where the window starts."""
    return Window(window.start - (seconds or window.seconds), window.start)


def acceptance_slices(
    db: Engine,
    window: Window,
    baseline: Window,
    filters: Filters = Filters(),
    settings: SliceSettings = SliceSettings(),
) -> SliceReport:
    now_rates, sampled_now = _per_slice(db, window, filters)
    before_rates, sampled_before = _per_slice(db, baseline, filters)
    keys = sorted(set(now_rates) & set(before_rates), key=repr)
    testable = [k for k in keys if min(len(now_rates[k][0]), len(before_rates[k][0])) >= settings.min_requests]
    p = np.array([_one_sided_p(now_rates[k], before_rates[k]) for k in testable])
    q = _false_discovery(p)
    captures = _capture_counts(db, {k[0] for k in testable}, time.time())
    found = [
        _slice(k, before_rates[k], now_rates[k], float(pk), float(qk), captures[k], settings)
        for k, pk, qk in zip(testable, p, q)
    ]
    found.sort(key=lambda s: (not s.lost, s.q_value, s.p_value))
    untested = len(set(now_rates) | set(before_rates)) - len(testable)
    lost = sum(s.lost for s in found)
    shown = found[: settings.limit]
    truncated = len(found) > len(shown)
    return SliceReport(
        window, baseline, settings, BANDS, len(found), untested, lost, shown, truncated, sampled_now, sampled_before
    )


def _per_slice(
    db: Engine, window: Window, filters: Filters
) -> tuple[dict[Key, tuple[np.ndarray, np.ndarray]], Subset | None]:
    """Per slice, the drafted and accepted tokens of each of its requests that drafted in `window` (a sample of
    a large window: `queries.sample_rows`)."""
    stmt = select(
        Request.drafter,
        Request.model,
        Request.tags,
        Request.prompt_tokens,
        Request.num_draft_tokens,
        Request.num_accepted_tokens,
    ).where(Request.num_draft_tokens > 0, Request.drafter.is_not(None), Request.draft_counts_known.is_(True))
    rows, sampled = sample_rows(db, stmt, window, filters, reader.population(db, window, filters))
    grouped: dict[Key, list[tuple[int, int]]] = defaultdict(list)
    for drafter, model, tags, prompt_tokens, drafted, accepted in rows:
        tags = tags or {}
        key = (drafter, model, tags.get("tenant"), tags.get("scenario"), band_of(prompt_tokens))
        grouped[key].append((drafted, accepted))
    return {k: tuple(np.array(c, dtype=float) for c in zip(*v)) for k, v in grouped.items()}, sampled


def _one_sided_p(now: tuple[np.ndarray, np.ndarray], before: tuple[np.ndarray, np.ndarray]) -> float:
    """Mann-Whitney U over per-request acceptance, alternative: now's is lower (1.0 where undefined)."""
    from scipy.stats import mannwhitneyu

    p = mannwhitneyu(now[1] / now[0], before[1] / before[0], alternative="less").pvalue
    return 1.0 if np.isnan(p) else float(p)


def _false_discovery(p: np.ndarray) -> np.ndarray:
    from scipy.stats import false_discovery_control

    return false_discovery_control(p, method="bh") if p.size else p


def _capture_counts(db: Engine, drafters: set[str], now: float) -> Counter:
    return Counter(
        (c.drafter, c.model, c.tenant, c.scenario, band_of(c.prompt_tokens)) for c in exportable_keys(db, drafters, now)
    )


def _side(rates: tuple[np.ndarray, np.ndarray]) -> Side:
    drafted, accepted = rates
    return Side(int(drafted.size), float(accepted.sum() / drafted.sum()))


def _slice(key: Key, before, now, p: float, q: float, captures: int, settings: SliceSettings) -> AcceptanceSlice:
    drafter, model, tenant, scenario, band = key
    was, is_ = _side(before), _side(now)
    lost = q < settings.alpha and is_.acceptance_rate < was.acceptance_rate
    candidate = captures >= settings.min_captures
    return AcceptanceSlice(drafter, model, tenant, scenario, BANDS[band], was, is_, p, q, lost, captures, candidate)
