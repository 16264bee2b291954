"""The drift detector's baseline keeps learning while the series is in control (alerts.drift `learn`):
Welford up to `baseline_memory` requests, then an exponentially weighted mean and variance; a drop is
still detected, the baseline does not follow it, and state rows from before the learning still load."""

from __future__ import annotations

from dataclasses import asdict, replace

import numpy as np
import pytest
from collector_payloads import T0, request_dict

from alerts.baselines import load_states, run_pass, to_row
from alerts.detector_settings import DriftSettings
from alerts.detector_store import save_rows
from alerts.drift import SeriesState, learn, run, step
from collector.db import write_transaction
from collector.store import Store
from telemetry.schema import IngestBatch

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


def records(start: int, count: int, accepted: list[int]) -> list[dict]:
    """`count` requests one second apart, drafting 16 tokens each, accepting per position `accepted`."""
    return [
        request_dict(i, request_id=f"b-{i}", accepted_per_position=accepted, num_accepted_tokens=sum(accepted), tags={})
        for i in range(start, start + count)
    ]


def ingest(engine, batch: list[dict]) -> None:
    Store(engine).insert(IngestBatch.model_validate({"requests": batch, "samples": [], "events": []}))


def test_the_leaders_pass_persists_the_learned_baseline_and_reads_an_old_row(engine):
    """Through the store: the pass saves `nb`, and a row written before it existed steps on."""
    settings = DriftSettings(warmup=20, decision_interval=5.0, rebaseline_after=0)
    batch = records(0, 30, [4, 4, 2, 0]) + records(30, 30, [4, 4, 4, 0])  # acceptance 0.625 then 0.75
    ingest(engine, batch)
    run_pass(engine, settings, T0 + 100)
    [(labels, state)] = load_states(engine).items()
    assert state.n == 60 and state.nb == 60  # a rise keeps the score at 0: every request was learned
    assert state.mean == pytest.approx((30 * 0.625 + 30 * 0.75) / 60)
    old = {k: v for k, v in asdict(state).items() if k != "nb"}  # as the pass wrote rows before `nb`
    with write_transaction(engine) as conn:
        save_rows(conn, [replace(to_row(labels, state, settings), state=old)])
    assert load_states(engine)[labels].nb is None
    ingest(engine, records(60, 5, [4, 4, 4, 0]))
    run_pass(engine, settings, T0 + 200)
    assert load_states(engine)[labels].nb == 20 + 5  # the old row's baseline was its warmup's
