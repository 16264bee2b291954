"""The drift detector's baseline keeps learning while the series is in control (alerts.drift `learn`):
Welford up to `baseline_memory` requests, then an exponentially weighted mean and variance; a drop is
still detected, the baseline does not follow it, and state rows from before the learning still load."""

from __future__ import annotations

import numpy as np
import pytest

from alerts.detector_settings import DriftSettings
from alerts.drift import SeriesState, learn, run, step

SETTINGS = DriftSettings(warmup=50, decision_interval=20.0, rebaseline_after=0, baseline_memory=400)


def feed(xs, settings=SETTINGS, state=None):
    state = state or SeriesState()
    for i, x in enumerate(xs):
        state = step(state, float(x), float(i), settings)
    return state


def bimodal(n: int, rng: np.random.Generator, factor: float = 1.0) -> np.ndarray:
    """Per-request acceptance of two prompt kinds (copy ~0.7, chat ~0.15), as on the recorded vLLM pool."""
    copy = rng.random(n) < 0.4
    return np.clip(np.where(copy, rng.normal(0.7, 0.15, n), rng.normal(0.15, 0.08, n)), 0, 1) * factor


def test_learning_is_welford_then_an_exponential_window():
    xs = np.random.default_rng(1).random(1000)
    state = SeriesState()
    for x in xs[:400]:
        state = learn(state, float(x), SETTINGS)
    assert state.nb == 400 and state.mean == pytest.approx(xs[:400].mean())
    assert state.stddev(SETTINGS) == pytest.approx(xs[:400].std(ddof=1))
    for x in xs[400:]:
        state = learn(state, float(x), SETTINGS)
    weights = (1 - 1 / 400) ** np.arange(600)[::-1]  # the last 600 values, newest weighted 1
    ew_mean = (1 - 1 / 400) ** 600 * xs[:400].mean() + (weights * xs[400:]).sum() / 400
    assert state.nb == 400 and state.mean == pytest.approx(ew_mean)


def test_a_stationary_bimodal_stream_is_not_alarmed_and_the_baseline_settles():
    rng = np.random.default_rng(2)
    settings = DriftSettings(baseline_memory=2000, rebaseline_after=0)  # the shipped warmup and h
    xs = bimodal(30_000, rng)
    scores = run(xs, settings)
    state = feed(xs, settings)
    assert max(scores) < 1.0
    assert state.nb == 2000 and state.mean == pytest.approx(xs.mean(), abs=0.03)


def test_a_step_is_detected_and_the_baseline_does_not_follow_it():
    rng = np.random.default_rng(3)
    before = feed(bimodal(3000, rng))
    after = before
    for i, x in enumerate(bimodal(2000, rng, factor=0.7)):
        after = step(after, float(x), float(i), SETTINGS)
        if after.alarm_n is not None:
            break
    assert after.alarm_n is not None and after.n - before.n < 300
    assert after.mean == pytest.approx(before.mean, rel=0.02)  # the drop hardly leaked into the baseline


def test_learning_off_keeps_the_warmup_baseline():
    settings = SETTINGS.model_copy(update={"learn_below_score": 0.0})
    xs = bimodal(2000, np.random.default_rng(4))
    state = feed(xs, settings)
    assert state.nb == 50 and state.mean == pytest.approx(xs[:50].mean())


def test_a_row_saved_before_the_baseline_learned_still_loads_and_steps():
    """Rows of the state table written before `nb` existed: the baseline is the warmup's (m2 over `warmup`)."""
    old = {"n": 80, "mean": 0.5, "m2": 49 * 0.01, "ewma": 0.5, "cusum": 0.0, "alarm_n": None, "last_at": 1.0}
    state = SeriesState(**old)
    assert state.baseline_count(SETTINGS) == 50 and state.stddev(SETTINGS) == pytest.approx(0.1)
    state = step(state, 0.5, 2.0, SETTINGS)
    assert state.nb == 51 and state.n == 81 and state.mean == pytest.approx(0.5)
