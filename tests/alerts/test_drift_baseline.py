"""The drift detector's baseline keeps learning while the series is in control (alerts.drift `learn`):
plain means up to `baseline_memory` requests, then an exponentially weighted mean; a drop is still
detected, the baseline does not follow it, requests that draft more weigh more without biasing it, and
state rows from before its statistic start a new baseline."""

from __future__ import annotations

from dataclasses import asdict, replace

import numpy as np
import pytest
from collector_payloads import T0, request_dict

from specwatch.alerts.baselines import load_states, run_pass, to_row
from specwatch.alerts.detector_settings import DriftSettings
from specwatch.alerts.detector_store import save_rows
from specwatch.alerts.drift import SeriesState, learn, run, step
from specwatch.collector.db import write_transaction
from specwatch.collector.ingest.store import Store
from specwatch.telemetry.schema import IngestBatch

SETTINGS = DriftSettings(warmup=50, decision_interval=20.0, rebaseline_after=0, baseline_memory=400)


def feed(xs, settings=SETTINGS, state=None, drafted=None):
    state = state or SeriesState()
    for i, x in enumerate(xs):
        state = step(state, float(x), 16 if drafted is None else int(drafted[i]), float(i), settings)
    return state


def bimodal(n: int, rng: np.random.Generator, factor: float = 1.0) -> np.ndarray:
    """Per-request acceptance of two prompt kinds (copy ~0.7, chat ~0.15), as on the recorded vLLM pool."""
    copy = rng.random(n) < 0.4
    return np.clip(np.where(copy, rng.normal(0.7, 0.15, n), rng.normal(0.15, 0.08, n)), 0, 1) * factor


def test_learning_is_welford_then_an_exponential_window():
    xs = np.random.default_rng(1).random(1000)
    drafted = np.random.default_rng(5).integers(8, 200, size=1000)
    z = np.sqrt(drafted) * np.arcsin(np.sqrt(xs))
    state = SeriesState()
    for x, d in zip(xs[:400], drafted[:400]):
        state = learn(state, float(x), int(d), SETTINGS)
    assert state.nb == 400 and state.mean == pytest.approx(xs[:400].mean())
    assert state.stddev() == pytest.approx(xs[:400].std(ddof=1))
    centre = z[:400].sum() / np.sqrt(drafted[:400]).sum()  # the √d-weighted mean of asin√x
    assert state.centre() == pytest.approx(centre)
    spread = (z[:400] - np.sqrt(drafted[:400]) * centre).std(ddof=1)
    assert state.spread(SETTINGS) == pytest.approx(spread)
    for x, d in zip(xs[400:], drafted[400:]):
        state = learn(state, float(x), int(d), SETTINGS)
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
        after = step(after, float(x), 16, float(i), SETTINGS)
        if after.alarm_n is not None:
            break
    assert after.alarm_n is not None and after.n - before.n < 300
    assert after.mean == pytest.approx(before.mean, rel=0.02)  # the drop hardly leaked into the baseline


def test_learning_off_keeps_the_warmup_baseline():
    settings = SETTINGS.model_copy(update={"learn_below_score": 0.0})
    xs = bimodal(2000, np.random.default_rng(4))
    state = feed(xs, settings)
    assert state.nb == 50 and state.mean == pytest.approx(xs[:50].mean())


def test_longer_requests_weigh_more_without_biasing_the_baseline():
    """Copy prompts draft ~6x the tokens of chat and accept more: the √d-weighted centre keeps the
    statistic at 0 in control (an unweighted one would drift up by the covariance and alarm)."""
    rng = np.random.default_rng(6)
    settings = DriftSettings(baseline_memory=2000, rebaseline_after=0)
    copy = rng.random(30_000) < 0.4
    xs = np.clip(np.where(copy, rng.normal(0.7, 0.15, copy.size), rng.normal(0.15, 0.08, copy.size)), 0, 1)
    drafted = np.where(copy, rng.integers(60, 140, copy.size), rng.integers(8, 30, copy.size))
    assert max(run(xs, settings, drafted=drafted)) < 1.0
    dropped = feed(xs[:3000], settings, drafted=drafted)
    for i in range(3000, 6000):  # then -15%
        dropped = step(dropped, 0.85 * float(xs[i]), int(drafted[i]), float(i), settings)
        if dropped.alarm_n is not None:
            break
    assert dropped.alarm_n is not None and dropped.n - 3000 < 600


def test_a_row_saved_before_the_statistic_starts_a_new_baseline():
    """Rows written by the detector on plain acceptance (no `moments`): their baseline is on another scale."""
    old = {"n": 80, "mean": 0.5, "m2": 49 * 0.01, "ewma": 0.5, "cusum": 3.0, "alarm_n": None, "last_at": 1.0}
    state = SeriesState.load(old)
    assert (state.n, state.nb, state.cusum, state.last_at) == (0, 0, 0.0, 1.0)
    state = step(state, 0.5, 16, 2.0, SETTINGS)
    assert state.nb == 1 and state.n == 1 and state.mean == pytest.approx(0.5)


def records(start: int, count: int, accepted: list[int]) -> list[dict]:
    """`count` requests one second apart, drafting 16 tokens each, accepting per position `accepted`."""
    return [
        request_dict(i, request_id=f"b-{i}", accepted_per_position=accepted, num_accepted_tokens=sum(accepted), tags={})
        for i in range(start, start + count)
    ]


def ingest(db, batch: list[dict]) -> None:
    Store(db).insert(IngestBatch.model_validate({"requests": batch, "samples": [], "events": []}))


def test_the_leaders_pass_persists_the_learned_baseline_and_restarts_an_old_row(db):
    """Through the store: the pass saves the baseline, and a row written before `moments` starts a new one."""
    settings = DriftSettings(warmup=20, decision_interval=5.0, rebaseline_after=0)
    batch = records(0, 30, [4, 4, 2, 0]) + records(30, 30, [4, 4, 4, 0])  # acceptance 0.625 then 0.75
    ingest(db, batch)
    run_pass(db, settings, T0 + 100)
    [(labels, state)] = load_states(db).items()
    assert state.n == 60 and state.nb == 60  # a rise keeps the score at 0: every request was learned
    assert state.mean == pytest.approx((30 * 0.625 + 30 * 0.75) / 60)
    y = np.arcsin(np.sqrt([0.625, 0.75]))
    assert state.centre() == pytest.approx(y.mean()) and state.moments[0] == pytest.approx(4.0)
    assert load_states(db)[labels] == state  # the JSON row round-trips
    old = {k: v for k, v in asdict(state).items() if k != "moments"}  # as the pass wrote rows before `moments`
    with write_transaction(db) as conn:
        save_rows(conn, [replace(to_row(labels, state, settings), state=old)])
    assert load_states(db)[labels].nb == 0
    ingest(db, records(60, 5, [4, 4, 4, 0]))
    run_pass(db, settings, T0 + 200)
    assert load_states(db)[labels].nb == 5  # a new baseline from the next requests
