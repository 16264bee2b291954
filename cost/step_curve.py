"""The break-even's step times from an engine's step-cost curve, both at the same batch size.

The curve (collector.reads.curve_reads: seconds per target forward by batch size b and token rows per request,
as the engine published it) gives

    t_plain(b)         = curve(b, 1 row per request)                   a plain step
    t_verify(gamma, b) = curve(b, gamma + 1 rows per request)          every request verifying gamma drafts

linearly interpolated between the two measured row counts around gamma + 1 (never extrapolated). b is the
batch size at which the engine ran the most forwards among those whose curve holds both (over the
instances that served the arm): the batch it mostly runs at, the same b for both times.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

from specwatch.collector.reads.curve_reads import CurvePoint, StoredCurve

EXACT = 1e-6  # rows closer than this to the asked count are that count


@dataclass(frozen=True)
class CurveTimes:
    """t_plain and t_verify (seconds) from one instance's curve at batch size `batch`, with its points there."""

    instance: str
    at: float  # the curve's event time (epoch s)
    batch: int
    t_plain: float
    t_verify: float
    points: tuple[CurvePoint, ...]  # the curve at `batch`: what the two times were read from

    @property
    def forwards(self) -> int:
        return sum(p.count for p in self.points)


def seconds_at(points: Sequence[CurvePoint], rows: float) -> float | None:
    """The curve at `rows` per request: a measured point, or linear between its measured neighbours;
    None outside the measured rows."""
    for p in points:
        if abs(p.rows - rows) <= EXACT:
            return p.seconds
    below = [p for p in points if p.rows < rows]
    above = [p for p in points if p.rows > rows]
    if not below or not above:
        return None
    lo, hi = max(below, key=lambda p: p.rows), min(above, key=lambda p: p.rows)
    return lo.seconds + (hi.seconds - lo.seconds) * (rows - lo.rows) / (hi.rows - lo.rows)


def by_batch(curve: StoredCurve) -> dict[int, tuple[CurvePoint, ...]]:
    found: dict[int, list[CurvePoint]] = defaultdict(list)
    for p in curve.points:
        found[p.batch].append(p)
    return {b: tuple(sorted(points, key=lambda p: p.rows)) for b, points in sorted(found.items())}


def curve_times(curves: Sequence[StoredCurve], gamma: float) -> CurveTimes | None:
    """Both times at the batch size with most forwards where some curve has them (module docstring)."""
    found = []
    for curve in curves:
        for batch, points in by_batch(curve).items():
            plain, verify = seconds_at(points, 1.0), seconds_at(points, gamma + 1.0)
            if plain is not None and verify is not None:
                found.append(CurveTimes(curve.instance, curve.at, batch, plain, verify, points))
    return max(found, key=lambda t: (t.forwards, -t.batch), default=None)


def lacking(curves: Sequence[StoredCurve], gamma: float) -> str:
    """Why no batch size has both times (a warning's text)."""
    have = "; ".join(
        f"{c.instance} b={b}: rows {points[0].rows:g}-{points[-1].rows:g}"
        for c in curves
        for b, points in by_batch(c).items()
    )
    return (
        f"the step-cost curve lacks the rows needed: no batch size with both 1 row per request and "
        f"{gamma + 1:.2f} (gamma + 1) measured ({have or 'no points'})"
    )
