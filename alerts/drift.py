"""Per-series acceptance baselines and a one-sided CUSUM: has this series' acceptance dropped?

A pure state machine, one request at a time (`step`), so the bench and the tests drive it with
any stream and the leader's pass (`alerts.baselines`) with the store's. For each series:

- each request that drafted d tokens and accepted a fraction x of them gives the statistic
  z = √d·asin√x (`statistic`): acceptance on the binomial's variance-stabilising scale, weighted by
  the root of the tokens behind it. On the recorded pools a −15% drop moves z by 0.227 of its
  spread against 0.196 for x itself (bench/drift_information.py, every random half agrees), so the
  CUSUM needs ~25% fewer requests at the same false-alarm rate;
- the first `warmup` requests set the baseline: the means of the moments of z (`MOMENTS`), from
  which its weighted mean m, its spread s (floored at `min_stddev` · mean √d) and the mean change
  D a drop of `relative_shift` of acceptance would make;
- then each request adds to a lower CUSUM in baseline spreads, its slack half the drop:
  `S = max(0, S + √d (m − asin√x) / s − D / 2s)`; the drift score is `S / h` (`decision_interval`),
  and a score >= 1 is a detected drop. With every request drafting alike this is the textbook
  CUSUM on asin√x, tuned to the drop;
- while the series is in control (its score before the request below `learn_below_score`), the
  request also refines the baseline: plain means over every such request up to `baseline_memory`
  of them, then an exponentially weighted mean over that span. A longer baseline has a smaller
  error, and an error in m is a bias of the CUSUM's drift: fewer false alarms and a steadier delay.
  The gate reads the previous state only, so it does not bias the baseline;
- the mean and stddev of plain acceptance and its EWMA are kept beside it for the alert's
  annotations (what a person reads), not for the decision;
- `rebaseline_after` requests past an alarm, the series starts a new baseline (the new level is
  then normal and the alert resolves); a recovery brings S back to 0 before that.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from specwatch.alerts.detector_settings import DriftSettings

# the baseline's means, in this order, of: w, w·y, w², w²·y, w²·y², w·(y − y at the drop), with
# w = √drafted and y = asin√acceptance; the weighted mean and spread of w·y follow from them
MOMENTS = ("w", "wy", "w2", "w2y", "w2y2", "wdrop")


def stabilised(x: float) -> float:
    """asin√x, the variance-stabilising transform of a binomial proportion (x clamped into [0, 1])."""
    return math.asin(math.sqrt(min(max(x, 0.0), 1.0)))


def statistic(x: float, drafted: int, relative_shift: float) -> tuple[float, ...]:
    """One request's contribution to each of `MOMENTS`."""
    w, y = math.sqrt(drafted), stabilised(x)
    dropped = stabilised((1.0 - relative_shift) * x)
    return (w, w * y, w * w, w * w * y, w * w * y * y, w * (y - dropped))


@dataclass(frozen=True)
class SeriesState:
    n: int = 0  # requests since the baseline (re)started
    mean: float = 0.0  # baseline mean of per-request acceptance (reported)
    m2: float = 0.0  # Welford's sum of squared deviations of that acceptance over the baseline's `nb` requests
    ewma: float | None = None
    cusum: float = 0.0
    alarm_n: int | None = None  # n at which the score first reached 1 (None: no alarm standing)
    last_at: float = 0.0
    nb: int = 0  # requests behind the baseline
    moments: tuple[float, ...] = (0.0,) * len(MOMENTS)  # the baseline's means of MOMENTS

    @classmethod
    def load(cls, saved: dict) -> SeriesState:
        """A stored row. Rows written before the detector's statistic was √d·asin√x carry no `moments`:
        their baseline is on another scale, so the series starts a new one (the next `warmup` requests)."""
        if "moments" not in saved or len(saved["moments"]) != len(MOMENTS):
            return cls(last_at=float(saved.get("last_at", 0.0)))
        return cls(**{**saved, "moments": tuple(saved["moments"])})

    def warmed_up(self, settings: DriftSettings) -> bool:
        return self.n > settings.warmup

    def stddev(self) -> float:
        """Of plain acceptance over the baseline (reported; the decision uses `spread`)."""
        return math.sqrt(self.m2 / (self.nb - 1)) if self.nb > 1 else 0.0

    def centre(self) -> float:
        """m: the √d-weighted baseline mean of asin√x, so that √d·(y − m) averages 0 in control."""
        w, wy = self.moments[0], self.moments[1]
        return wy / w if w > 0 else 0.0

    def spread(self, settings: DriftSettings) -> float:
        """s: the baseline's standard deviation of √d·(y − m), floored at `min_stddev` · mean √d."""
        w, _, w2, w2y, w2y2, _ = self.moments
        m = self.centre()
        variance = max(0.0, w2y2 - 2.0 * m * w2y + m * m * w2) * self.nb / max(1, self.nb - 1)
        return max(math.sqrt(variance), settings.min_stddev * w)

    def score(self, settings: DriftSettings) -> float:
        return self.cusum / settings.decision_interval

    def relative_change(self) -> float:
        """EWMA level vs baseline - 1 (-0.15: 15% below)."""
        return (self.ewma / self.mean - 1.0) if self.ewma is not None and self.mean > 0 else 0.0


def ewma_weight(halflife: int) -> float:
    return 1.0 - 0.5 ** (1.0 / halflife)


def learn(state: SeriesState, x: float, drafted: int, settings: DriftSettings) -> SeriesState:
    """The request into the baseline: plain means up to `baseline_memory` requests, then an EWMA of that span."""
    nb = state.nb
    w = 1.0 / (nb + 1) if nb < settings.baseline_memory else 1.0 / nb
    values = statistic(x, drafted, settings.relative_shift)
    moments = tuple(m + w * (v - m) for m, v in zip(state.moments, values))
    delta = x - state.mean
    mean = state.mean + w * delta
    if nb < settings.baseline_memory:  # Welford
        return replace(state, nb=nb + 1, mean=mean, m2=state.m2 + delta * (x - mean), moments=moments)
    variance = (1.0 - w) * (state.m2 / (nb - 1) + w * delta * delta)  # the exponentially weighted update
    return replace(state, mean=mean, m2=variance * (nb - 1), moments=moments)


def step(state: SeriesState, x: float, drafted: int, at: float, settings: DriftSettings) -> SeriesState:
    """One request's acceptance `x` (in [0, 1]) of `drafted` (>= 1) draft tokens, at `at`."""
    n = state.n + 1
    ewma = x if state.ewma is None else state.ewma + ewma_weight(settings.ewma_halflife) * (x - state.ewma)
    if n <= settings.warmup:  # the baseline's first requests: nothing to compare with yet
        return replace(learn(state, x, drafted, settings), n=n, ewma=ewma, last_at=at)
    s = state.spread(settings)
    k = state.moments[5] / (2.0 * s)  # half the drop to detect, in spreads
    deviation = math.sqrt(drafted) * (state.centre() - stabilised(x))
    cusum = max(0.0, state.cusum + deviation / s - k)
    alarm_n = None if cusum == 0.0 else state.alarm_n
    if alarm_n is None and cusum >= settings.decision_interval:
        alarm_n = n
    if alarm_n is not None and settings.rebaseline_after and n - alarm_n >= settings.rebaseline_after:
        return SeriesState(last_at=at)  # the new level is the norm: learn it afresh
    in_control = state.alarm_n is None and state.score(settings) < settings.learn_below_score
    learned = learn(state, x, drafted, settings) if in_control else state
    return replace(learned, n=n, ewma=ewma, cusum=cusum, alarm_n=alarm_n, last_at=at)


def run(xs, settings: DriftSettings, drafted=16, state: SeriesState | None = None) -> list[float]:
    """The score after each value of `xs` (for the bench and tests; timestamps are the indexes).
    `drafted`: each request's draft tokens, one count for all or one per value."""
    counts = [drafted] * len(xs) if isinstance(drafted, int) else drafted
    state, scores = state or SeriesState(), []
    for i, (x, d) in enumerate(zip(xs, counts)):
        state = step(state, float(x), int(d), float(i), settings)
        scores.append(state.score(settings))
    return scores
