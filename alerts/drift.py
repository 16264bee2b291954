"""Per-series acceptance baselines and a one-sided CUSUM: has this series' acceptance dropped?

A pure state machine, one request at a time (`step`), so the bench and the tests drive it with
any stream and the leader's pass (`alerts.baselines`) with the store's. For each series:

- the first `warmup` requests set the baseline: mean and stddev of per-request acceptance
  (accepted / drafted tokens, requests drafting at least `min_drafted_tokens`);
- then each request adds to a lower CUSUM in baseline stddevs, tuned to a drop of
  `relative_shift` of the mean (slack k = half of it):
  `S = max(0, S + (mean - x) / sd - k)`; the drift score is `S / h` (`decision_interval`), and
  a score >= 1 is a detected drop. The EWMA of acceptance is reported beside the baseline;
- while the series is in control (its score before the request below `learn_below_score`), the
  request also refines the baseline: Welford over every such request up to `baseline_memory` of
  them, then an exponentially weighted mean and variance of that span. A longer baseline has a
  smaller error, and an error in the mean is a bias of the CUSUM's drift: fewer false alarms and
  a steadier delay. The gate reads the previous state only, so it does not bias the baseline;
- `rebaseline_after` requests past an alarm, the series starts a new baseline (the new level is
  then normal and the alert resolves); a recovery brings S back to 0 before that.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from alerts.detector_settings import DriftSettings


@dataclass(frozen=True)
class SeriesState:
    n: int = 0  # requests since the baseline (re)started
    mean: float = 0.0  # baseline mean of per-request acceptance
    m2: float = 0.0  # Welford's sum of squared deviations of the baseline's `nb` requests
    ewma: float | None = None
    cusum: float = 0.0
    alarm_n: int | None = None  # n at which the score first reached 1 (None: no alarm standing)
    last_at: float = 0.0
    nb: int | None = None  # requests behind the baseline (None: a row from before it learned: the warmup)

    def baseline_count(self, settings: DriftSettings) -> int:
        return self.nb if self.nb is not None else min(self.n, settings.warmup)

    def warmed_up(self, settings: DriftSettings) -> bool:
        return self.n > settings.warmup

    def stddev(self, settings: DriftSettings) -> float:
        variance = self.m2 / max(1, self.baseline_count(settings) - 1)
        return max(math.sqrt(variance), settings.min_stddev)

    def score(self, settings: DriftSettings) -> float:
        return self.cusum / settings.decision_interval

    def relative_change(self) -> float:
        """EWMA level vs baseline - 1 (-0.15: 15% below)."""
        return (self.ewma / self.mean - 1.0) if self.ewma is not None and self.mean > 0 else 0.0


def ewma_weight(halflife: int) -> float:
    return 1.0 - 0.5 ** (1.0 / halflife)


def learn(state: SeriesState, x: float, settings: DriftSettings) -> SeriesState:
    """`x` into the baseline: Welford up to `baseline_memory` requests, then an EWMA of that span."""
    nb = state.baseline_count(settings)
    delta = x - state.mean
    if nb < settings.baseline_memory:
        mean = state.mean + delta / (nb + 1)
        return replace(state, nb=nb + 1, mean=mean, m2=state.m2 + delta * (x - mean))
    w = 1.0 / nb  # variance (1 - w) (var + w delta^2): the exponentially weighted update
    variance = (1.0 - w) * (state.m2 / (nb - 1) + w * delta * delta)
    return replace(state, nb=nb, mean=state.mean + w * delta, m2=variance * (nb - 1))


def step(state: SeriesState, x: float, at: float, settings: DriftSettings) -> SeriesState:
    """One request's acceptance `x` (in [0, 1]) at `at`."""
    n = state.n + 1
    ewma = x if state.ewma is None else state.ewma + ewma_weight(settings.ewma_halflife) * (x - state.ewma)
    if n <= settings.warmup:  # the baseline's first requests: nothing to compare with yet
        return replace(learn(state, x, settings), n=n, ewma=ewma, last_at=at)
    sd = state.stddev(settings)
    k = settings.relative_shift * state.mean / (2.0 * sd)  # half the drop to detect, in stddevs
    cusum = max(0.0, state.cusum + (state.mean - x) / sd - k)
    alarm_n = None if cusum == 0.0 else state.alarm_n
    if alarm_n is None and cusum >= settings.decision_interval:
        alarm_n = n
    if alarm_n is not None and settings.rebaseline_after and n - alarm_n >= settings.rebaseline_after:
        return SeriesState(last_at=at)  # the new level is the norm: learn it afresh
    in_control = state.alarm_n is None and state.score(settings) < settings.learn_below_score
    learned = learn(state, x, settings) if in_control else state
    return replace(learned, n=n, ewma=ewma, cusum=cusum, alarm_n=alarm_n, last_at=at)


def run(xs, settings: DriftSettings, state: SeriesState | None = None) -> list[float]:
    """The score after each value of `xs` (for the bench and tests; timestamps are the indexes)."""
    state, scores = state or SeriesState(), []
    for i, x in enumerate(xs):
        state = step(state, float(x), float(i), settings)
        scores.append(state.score(settings))
    return scores
