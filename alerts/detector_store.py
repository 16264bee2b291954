"""The change detectors' rows (alerts.tables: `alert_detector_series`, `alert_detector_cursors`):
each series' state and output, and where each pass over the requests continues.

A row is a `SeriesRow`: its kind (drift, regression), labels, the value its alert signal reads,
the observations behind it, whether it is significant, annotations for the alert, and the
detector's own state (JSON). Signals and the /metrics gauges read them back with `series_rows`.
"""

from __future__ import annotations

import hashlib
from dataclasses import asdict, dataclass, field

from sqlalchemy import Connection, Engine, delete, insert, select

from specwatch.alerts.tables import alert_detector_cursors, alert_detector_series

Labels = tuple[tuple[str, str], ...]  # sorted (name, value) pairs


@dataclass(frozen=True)
class SeriesRow:
    kind: str
    labels: Labels
    value: float
    count: int
    significant: bool
    annotations: dict[str, str] = field(default_factory=dict)
    state: dict = field(default_factory=dict)
    updated_at: float = 0.0

    @property
    def series(self) -> str:
        text = self.kind + "\xff" + "\xff".join(f"{k}\xfe{v}" for k, v in self.labels)
        return hashlib.sha256(text.encode()).hexdigest()[:32]


def _row(record) -> SeriesRow:
    labels = tuple(sorted((str(k), str(v)) for k, v in dict(record.labels).items()))
    fields = ("value", "count", "significant", "annotations", "state", "updated_at")
    return SeriesRow(record.kind, labels, **{f: getattr(record, f) for f in fields})


def series_rows(db: Engine, kind: str, since: float | None = None) -> list[SeriesRow]:
    """The kind's rows, those updated at or after `since` when given."""
    t = alert_detector_series.c
    stmt = select(alert_detector_series).where(t.kind == kind)
    if since is not None:
        stmt = stmt.where(t.updated_at >= since)
    with db.connect() as conn:
        return [_row(r) for r in conn.execute(stmt)]


def save_rows(conn: Connection, rows: list[SeriesRow], replace_kind: str | None = None) -> None:
    """Upsert `rows` (delete then insert, by series); `replace_kind` first drops every row of that kind."""
    t = alert_detector_series
    if replace_kind is not None:
        conn.execute(delete(t).where(t.c.kind == replace_kind))
    elif rows:
        conn.execute(delete(t).where(t.c.series.in_([r.series for r in rows])))
    if rows:
        conn.execute(insert(t), [{**asdict(r), "labels": dict(r.labels), "series": r.series} for r in rows])


def cursor(conn: Connection, name: str) -> int | None:
    return conn.scalar(select(alert_detector_cursors.c.position).where(alert_detector_cursors.c.name == name))


def save_cursor(conn: Connection, name: str, position: int) -> None:
    conn.execute(delete(alert_detector_cursors).where(alert_detector_cursors.c.name == name))
    conn.execute(insert(alert_detector_cursors).values(name=name, position=position))
