"""Per-request reads: one series' recent drafted requests (the anomaly pass, `alerts.anomaly_pass`),
the Requests listing (filters, sort, keyset pages) and one request's detail (`GET /v1/requests`).
"""

from __future__ import annotations

from sqlalchemy import Engine, select

from collector.detector_reads import _DRAFTED_COLUMNS, DraftedRequest, _drafted
from collector.models import Request


def recent_drafted(
    engine: Engine, series: tuple[str, str, str | None], before_id: int, limit: int, min_drafted: int
) -> tuple[DraftedRequest, ...]:
    """The last `limit` drafted speculative requests of (instance, model, drafter) with id < `before_id`,
    oldest first: the history a new request of that series is judged against."""
    instance, model, drafter = series
    stmt = select(*_DRAFTED_COLUMNS).where(
        Request.id < before_id,
        Request.instance == instance,
        Request.model == model,
        Request.drafter.is_(None) if drafter is None else Request.drafter == drafter,
        Request.mode == "speculative",
        Request.num_draft_tokens >= min_drafted,
    )
    with engine.connect() as conn:
        rows = conn.execute(stmt.order_by(Request.id.desc()).limit(limit)).all()
    return tuple(_drafted(row) for row in reversed(rows))
