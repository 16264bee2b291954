"""The engine publishes its step-cost curve: a `step_costs` EngineEvent, so the cost model can read it.

The curve (`Engine.step_costs`, engine/lookahead.py) holds seconds per target forward by batch size
and rows per request, as the scheduler observes every forward. The event's detail:

    {"points": [[batch size, rows per request, seconds, forwards observed], ...],
     "weighting": "ewma 0.2", "dropped": points left out to fit the contract's 4 KiB detail}

seconds is the curve's exponentially weighted mean (weight 0.2 per forward), the figure the lookahead and
the device-time split use. Rows are rounded to 2 decimals (points that then coincide merge, weighted by
count) and the points observed least often are dropped until the detail fits.

`StepCostEvents` checks every `check_s`, and emits when the curve has changed materially since the last
event (a new point, or a point's seconds moved by `change` or more) and at least `every_s` after that
event (the first one: at once); at `stop()` (the server's shutdown) it emits whatever changed.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from specwatch.engine.device import Periodic
from specwatch.engine.lookahead import CostCurve

KIND = "step_costs"
MAX_POINTS = 96  # ~30 characters each in the detail's repr: well inside 4096
DETAIL_CHARS = 4000  # the contract's MAX_DETAIL_CHARS (4096) less a margin

Point = tuple[int, float, float, int]  # batch size, rows per request, seconds, count


@dataclass(frozen=True)
class StepCostEventsConfig:
    every_s: float = 60.0  # at most one event per this many seconds (shutdown aside)
    check_s: float = 5.0
    change: float = 0.05  # relative change of a point's seconds that is material

    def __post_init__(self) -> None:
        if not (self.every_s >= 0 and self.check_s > 0 and self.change > 0):
            raise ValueError("step-cost events: every_s >= 0, check_s > 0 and change > 0")


def curve_points(curve: CostCurve) -> list[Point]:
    """The curve's points, rows rounded to 2 decimals (coinciding points merged, weighted by count)."""
    merged: dict[tuple[int, float], tuple[float, int]] = {}
    for batch, by_rows in sorted(dict(curve.seconds).items()):
        counts = dict(curve.counts.get(batch, {}))
        for rows, seconds in sorted(dict(by_rows).items()):
            n = max(counts.get(rows, 1), 1)
            key = (batch, round(float(rows), 2))
            total, count = merged.get(key, (0.0, 0))
            merged[key] = (total + seconds * n, count + n)
    return [(b, r, total / n, n) for (b, r), (total, n) in sorted(merged.items())]


def event_detail(points: list[Point]) -> dict:
    """The event's detail (module docstring): the points most observed first kept, within the size limit."""
    kept = sorted(points, key=lambda p: -p[3])[:MAX_POINTS]
    while True:
        rows = [[b, r, float(f"{s:.4g}"), n] for b, r, s, n in sorted(kept)]
        detail = {"points": rows, "weighting": "ewma 0.2", "dropped": len(points) - len(kept)}
        if len(repr(detail)) <= DETAIL_CHARS or not kept:
            return detail
        kept = kept[: len(kept) * 9 // 10]


def material(new: list[Point], old: list[Point] | None, change: float) -> bool:
    """A new point, or a point's seconds moved by `change` (relative) or more."""
    if old is None:
        return bool(new)
    before = {(b, r): s for b, r, s, _ in old}
    return any((b, r) not in before or _moved(before[(b, r)], s, change) for b, r, s, _ in new)


def _moved(old: float, new: float, change: float) -> bool:
    return abs(new - old) >= change * max(abs(old), 1e-12) or not math.isfinite(new)


class StepCostEvents(Periodic):
    """Emits the curve as `step_costs` events through `emit` (a TelemetrySink's), see the module docstring.
    `clock`: monotonic seconds (tests step it)."""

    def __init__(
        self,
        curve: CostCurve,
        emit: Callable[[str, dict], None],
        config: StepCostEventsConfig = StepCostEventsConfig(),
        clock: Callable[[], float] | None = None,
    ) -> None:
        super().__init__(config.check_s, "specwatch-step-costs")
        self.curve, self.emit, self.config = curve, emit, config
        self.clock = clock or time.monotonic
        self.sent: list[Point] | None = None
        self.sent_at = -math.inf

    def tick(self) -> None:
        self.publish(final=False)

    def publish(self, final: bool) -> bool:
        """Emit now if due (final: whenever anything changed); whether it did."""
        points = _snapshot(self.curve)
        if final:
            due = bool(points) and points != self.sent
        else:
            due = self.clock() - self.sent_at >= self.config.every_s and material(points, self.sent, self.config.change)
        if due:
            self.emit(KIND, event_detail(points))
            self.sent, self.sent_at = points, self.clock()
        return due

    def stop(self) -> None:
        """Stop checking (when started) and emit what changed since the last event."""
        if self.started:
            super().stop()
        self.publish(final=True)

    @property
    def started(self) -> bool:
        return self._thread.ident is not None


def _snapshot(curve: CostCurve) -> list[Point]:
    """The points, read while the scheduler may be adding to the curve (a resize mid-read: read again)."""
    for _ in range(5):
        try:
            return curve_points(curve)
        except RuntimeError:
            continue
    return curve_points(curve)
