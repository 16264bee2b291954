"""The engine publishes its step-cost curve (engine/step_cost_events.py): when, and within the contract."""

from __future__ import annotations

from specwatch.engine.lookahead import CostCurve
from specwatch.engine.step_cost_events import KIND, StepCostEvents, StepCostEventsConfig, curve_points, event_detail
from specwatch.telemetry.schema import MAX_DETAIL_CHARS, EngineEvent


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def publisher(curve: CostCurve, clock: Clock) -> tuple[StepCostEvents, list]:
    sent: list = []
    events = StepCostEvents(curve, lambda kind, detail: sent.append((kind, detail)), StepCostEventsConfig(), clock)
    return events, sent


def test_points_carry_counts_and_merge_rounded_rows():
    curve = CostCurve()
    for seconds in (0.040, 0.040, 0.040):
        curve.observe(1, 1, seconds)
    curve.observe(3, 7 / 3, 0.090)  # kept at its own batch size, 3
    curve.observe(3, 2.3333333, 0.070)  # the same 2 decimals: merged, weighted by count
    curve.observe(4, 2.3333333, 0.075)
    assert curve_points(curve) == [(1, 1.0, 0.040, 3), (3, 2.33, 0.080, 2), (4, 2.33, 0.075, 1)]


def test_first_curve_at_once_then_at_most_every_minute_when_material_and_at_shutdown():
    curve, clock = CostCurve(), Clock()
    events, sent = publisher(curve, clock)
    assert not events.publish(final=False)  # nothing measured yet
    curve.observe(1, 1, 0.040)
    assert events.publish(final=False) and sent[-1][0] == KIND
    curve.observe(1, 5, 0.060)  # a new point, but within the minute
    clock.now += 30
    assert not events.publish(final=False)
    clock.now += 31
    assert events.publish(final=False)
    clock.now += 120
    curve.observe(1, 1, 0.0405)  # a 0.25% move: not material
    assert not events.publish(final=False)
    events.stop()  # never started: shutdown still sends what changed
    assert len(sent) == 3 and sent[-1][1]["points"] == [[1, 1.0, 0.0401, 2], [1, 5.0, 0.06, 1]]
    events.stop()  # nothing changed since: nothing sent
    assert len(sent) == 3


def test_a_large_curve_fits_the_contract_keeping_the_most_observed_points():
    curve = CostCurve()
    for batch in (1, 2, 4, 8, 16, 32):
        for i in range(120):
            for _ in range(1 + (i == 7)):
                curve.observe(batch, 1 + i / 37, 0.01 * batch + 0.001 * i)
    detail = event_detail(curve_points(curve))
    event = EngineEvent(instance="e", at=2e9, kind=KIND, detail=detail)  # the contract accepts it
    assert len(repr(event.detail)) <= MAX_DETAIL_CHARS
    assert detail["dropped"] > 0 and len(detail["points"]) + detail["dropped"] == 6 * 120
    assert all([b, round(1 + 7 / 37, 2)] in [p[:2] for p in detail["points"]] for b in (1, 2, 4, 8, 16, 32))
