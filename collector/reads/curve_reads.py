"""The engines' step-cost curves as stored: the latest `step_costs` event of each instance in a window.

    step_curves(db, window, instances)   instance -> StoredCurve (plain frozen rows, no ORM)

The engine emits the event (engine/step_cost_events.py) with detail
`{"points": [[batch bucket, rows per request, seconds, forwards observed], ...]}`; a point that is not
four finite numbers (batch and count >= 1, rows >= 1, seconds > 0) is skipped, never guessed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from sqlalchemy import Engine, and_, func, select

from specwatch.collector.models import EngineEventRow
from specwatch.collector.reads.queries import Window

KIND = "step_costs"


@dataclass(frozen=True)
class CurvePoint:
    batch: int  # the engine's batch bucket: 1, 2, 4, 8, ... (batch sizes 3-4 share 4)
    rows: float  # token rows per request in the forward: 1 plain, gamma + 1 for requests drafting gamma
    seconds: float  # per forward (the engine's exponentially weighted mean)
    count: int  # forwards observed


@dataclass(frozen=True)
class StoredCurve:
    instance: str
    at: float  # the event's time (epoch s)
    points: tuple[CurvePoint, ...]


def step_curves(db: Engine, window: Window, instances: Sequence[str]) -> dict[str, StoredCurve]:
    """The latest `step_costs` event in `window` of each of `instances` that has one."""
    if not instances:
        return {}
    e = EngineEventRow
    latest = (
        select(e.instance, func.max(e.at).label("at"))
        .where(e.kind == KIND, e.at >= window.start, e.at < window.end, e.instance.in_(list(instances)))
        .group_by(e.instance)
        .subquery()
    )
    stmt = select(e.instance, e.at, e.detail).join(
        latest, and_(e.instance == latest.c.instance, e.at == latest.c.at, e.kind == KIND)
    )
    with db.connect() as conn:
        rows = conn.execute(stmt).all()
    return {name: StoredCurve(name, float(at), parse_points(detail)) for name, at, detail in rows}


def parse_points(detail: dict) -> tuple[CurvePoint, ...]:
    """The detail's well-formed points (module docstring), sorted by batch and rows."""
    found = (_point(item) for item in (detail or {}).get("points") or ())
    return tuple(sorted((p for p in found if p is not None), key=lambda p: (p.batch, p.rows)))


def _point(item) -> CurvePoint | None:
    if not isinstance(item, list | tuple) or len(item) != 4:
        return None
    if not all(isinstance(x, int | float) and not isinstance(x, bool) and math.isfinite(x) for x in item):
        return None
    batch, rows, seconds, count = item
    if batch < 1 or rows < 1 or seconds <= 0 or count < 1:
        return None
    return CurvePoint(int(batch), float(rows), float(seconds), int(count))
