"""Reads the change detectors need (alerts.baselines, alerts.regression, alerts.anomalies), as plain
values: new drafted requests in arrival order (by id, a keyset cursor), deploy markers (`config`
engine events), and the per-request acceptance of one instance around a marker.

Arrival order is the rows' id order. On PostgreSQL a transaction that commits after a later id was
read leaves its rows behind the cursor; the detectors are statistical and lose only those samples.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine, func, select

from specwatch.collector.models import EngineEventRow, Request
from specwatch.collector.reads.queries import Window


@dataclass(frozen=True)
class DraftedRequest:
    """A finished speculative request that drafted, as the detectors see it."""

    id: int
    request_id: str
    started_at: float
    instance: str
    model: str
    drafter: str | None
    tags: dict[str, str]
    status: str
    drafted: int
    accepted: int
    drafts: int
    output_tokens: int
    accepted_per_position: tuple[int, ...]

    @property
    def acceptance(self) -> float:
        return self.accepted / self.drafted


@dataclass(frozen=True)
class Marker:
    """A deploy marker: an instance's `config` event (its version, model, drafter at start or on change)."""

    instance: str
    at: float
    detail: dict


_DRAFTED_COLUMNS = (
    Request.id,
    Request.request_id,
    Request.started_at,
    Request.instance,
    Request.model,
    Request.drafter,
    Request.tags,
    Request.status,
    Request.num_draft_tokens,
    Request.num_accepted_tokens,
    Request.num_drafts,
    Request.output_tokens,
    Request.accepted_per_position,
)


def _drafted(row) -> DraftedRequest:
    *head, per_position = row
    return DraftedRequest(*head, tuple(per_position or ()))


def cursor_start(db: Engine, started_after: float) -> int:
    """The id just below the first request that started after `started_after` (or the newest id)."""
    with db.connect() as conn:
        first = conn.scalar(select(func.min(Request.id)).where(Request.started_at >= started_after))
        newest = conn.scalar(select(func.max(Request.id)))
    return int(first) - 1 if first is not None else int(newest or 0)


def drafted_since(db: Engine, after_id: int, limit: int) -> tuple[tuple[DraftedRequest, ...], int]:
    """The drafted speculative requests among the `limit` rows after id `after_id`, oldest first, and
    the id the next read continues after (the last row read, drafted or not)."""
    stmt = select(*_DRAFTED_COLUMNS, Request.mode).where(Request.id > after_id).order_by(Request.id).limit(limit)
    with db.connect() as conn:
        rows = conn.execute(stmt).all()
    found = tuple(_drafted(row[:-1]) for row in rows if row.mode == "speculative" and row.num_draft_tokens > 0)
    return found, int(rows[-1].id) if rows else after_id


def config_markers(db: Engine, window: Window) -> tuple[Marker, ...]:
    """The `config` events in the window, oldest first."""
    e = EngineEventRow
    stmt = select(e.instance, e.at, e.detail).where(e.kind == "config", e.at >= window.start, e.at < window.end)
    with db.connect() as conn:
        return tuple(Marker(i, float(at), dict(d or {})) for i, at, d in conn.execute(stmt.order_by(e.at)))


def instance_drafted(db: Engine, instance: str, window: Window, min_drafted: int) -> tuple[DraftedRequest, ...]:
    """One instance's drafted speculative requests that started in the window (by started_at)."""
    stmt = select(*_DRAFTED_COLUMNS).where(
        Request.instance == instance,
        Request.started_at >= window.start,
        Request.started_at < window.end,
        Request.mode == "speculative",
        Request.num_draft_tokens >= min_drafted,
    )
    with db.connect() as conn:
        return tuple(_drafted(row) for row in conn.execute(stmt.order_by(Request.started_at)))
