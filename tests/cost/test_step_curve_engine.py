"""The real engine's step-cost curve reaches a real collector, and the break-even then rests on it.

The bundled model serves plain and n-gram requests (copying a passage) one at a time (batch 1), its
telemetry going to a collector process. Before the engine's `step_costs` event (emitted at shutdown by
`StepCostEvents.stop`, as `engine serve` does) the break-even uses the records' timings and warns;
after it, the curve's.
"""

from __future__ import annotations

import time

import pytest

from specwatch.collector.db import make_db
from specwatch.collector.reads.curve_reads import step_curves
from specwatch.collector.reads.queries import Window
from specwatch.common.procs import free_port, start_collector
from specwatch.cost.breakeven import RECORDS, STEP_CURVE, BreakEven
from specwatch.cost.inputs import load_prices
from specwatch.cost.step_curve import seconds_at
from specwatch.cost.summary import measured_summary
from specwatch.engine.policy import PolicyConfig
from specwatch.engine.step_cost_events import StepCostEvents, curve_points
from specwatch.telemetry.client import TelemetryClient
from specwatch.telemetry.sink import TelemetrySink
from specwatch.workload import chat
from tests.engine.test_server import Server


def _ngram(store, window: Window) -> BreakEven:
    summary = measured_summary(store, window, load_prices())
    (found,) = [b for b in summary.break_even if b.key == "speculative:ngram"]
    return found


def _serve(engine, sink: TelemetrySink) -> list:
    with Server(engine, slots=1, policy=PolicyConfig(min_acceptance=0.0), sink=sink) as server:
        client = server.client()
        for drafter in ("none", "ngram", "none", "ngram"):
            body = {"drafter": drafter, "gamma": 4}
            client.chat.completions.create(
                model=engine.target.name, messages=chat("grounded"), max_tokens=24, temperature=0, extra_body=body
            )
        return list(server.records)


def test_the_engine_curve_reaches_the_collector_and_sets_the_break_even(bundled_engine, tmp_path):
    port, db = free_port(), tmp_path / "collector.db"
    data = {"SPECWATCH_DATA_DIR": str(tmp_path)}
    collector = start_collector(port, tmp_path / "collector.log", f"sqlite:///{db}", data)
    client = TelemetryClient(f"http://127.0.0.1:{port}", spool_dir=tmp_path / "spool", flush_interval_s=0.2)
    started = time.time()
    try:
        sink = TelemetrySink("test", client)
        events = StepCostEvents(bundled_engine.step_costs, sink.emit)  # not started: emits at stop
        records = _serve(bundled_engine, sink)
        assert {r.mode for r in records} == {"speculative", "autoregressive"} and sum(r.num_drafts for r in records)
        client.flush(timeout=30)
        store = make_db(f"sqlite:///{db}")
        window = Window(started - 1, time.time() + 5)
        before = _ngram(store, window)
        events.stop()  # the engine's shutdown: the curve as it ends
        client.flush(timeout=30)
        stored = step_curves(store, window, ["test"])
        after = _ngram(store, window)
        store.dispose()
    finally:
        client.close()
        collector.terminate()
        collector.wait(timeout=30)
    assert before.times_from == RECORDS
    assert any("no step-cost curve stored" in w for w in before.warnings)
    sent = {(b, r): (s, n) for b, r, s, n in curve_points(bundled_engine.step_costs)}
    assert stored["test"].points and all(
        sent[(p.batch, p.rows)] == (pytest.approx(p.seconds, rel=1e-3), p.count) for p in stored["test"].points
    )  # what the engine measured (seconds to 4 digits; the least observed points dropped past 4 KiB)
    assert after.times_from == STEP_CURVE and after.curve_instance == "test"
    points = [p for p in stored["test"].points if p.batch == after.batch]
    assert after.t_plain_s == seconds_at(points, 1.0) and after.t_verify_s == seconds_at(points, after.gamma + 1)
    assert after.verify_cost_ratio == pytest.approx(after.t_verify_s / after.t_plain_s)
    assert not any("curve" in w for w in after.warnings)


def test_engine_serve_publishes_its_curve(live_collector):
    """`specwatch engine serve --collector URL` (the session's live engine) sends its curve while serving."""
    store = make_db(f"sqlite:///{live_collector['db']}")
    curves = step_curves(store, Window(time.time() - 3600, time.time() + 1), ["laptop"])
    store.dispose()
    assert {p.rows for p in curves["laptop"].points} >= {1.0} and all(p.count >= 1 for p in curves["laptop"].points)
