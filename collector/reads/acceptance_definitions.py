"""The counts behind acceptance definitions other than the mean (telemetry/ratios.py): conditional
acceptance at position 0 needs the drafts whose first token was accepted, which only the per-position
lists carry (the per-second aggregates keep no per-position sums), so it is read from raw rows."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from sqlalchemy import Engine, select

from specwatch.collector.models import Request
from specwatch.collector.reads.queries import Window


def first_position_counts(db: Engine, window: Window, group_by: Sequence[str]) -> dict[tuple, tuple[float, float, int]]:
    """Per label set of `group_by` (Request columns): (drafts, drafts whose first token was accepted,
    requests) of the window's requests that drafted and report per-position counts."""
    r = Request
    stmt = select(*(getattr(r, g) for g in group_by), r.num_drafts, r.accepted_per_position).where(
        r.started_at >= window.start, r.started_at < window.end, r.num_drafts > 0, r.gamma > 0
    )
    found: dict[tuple, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    k = len(group_by)
    with db.connect() as conn:
        for row in conn.execute(stmt):
            totals = found[tuple(row[:k])]
            totals[0] += row[k]
            totals[1] += row[k + 1][0] if row[k + 1] else 0
            totals[2] += 1
    return {key: (drafts, first, int(n)) for key, (drafts, first, n) in found.items()}
