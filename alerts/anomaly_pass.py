"""The anomaly pass on the leader: judge each new drafted request once against its series
(`alerts.anomalies`) and write its flags to `request_flags`, with the pass's cursor, in one transaction.

A series is the drift detector's (`alerts.baselines.series_labels`: model, drafter, instance, tag). A new
request is judged with the other new requests of its series and the series' last `history` requests
before them (`collector.request_reads.recent_drafted`), so a flag needs no warm state in memory.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, delete, insert

from alerts.anomalies import Flag, flag
from alerts.baselines import series_labels
from alerts.detector_settings import DetectorSettings
from alerts.detector_store import Labels, cursor, save_cursor
from alerts.tables import request_flags
from collector.db import write_transaction
from collector.detector_reads import DraftedRequest, cursor_start, drafted_since
from collector.request_reads import recent_drafted

KIND = "anomalies"


@dataclass(frozen=True)
class AnomalyPass:
    read: int  # drafted requests read after the cursor
    judged: int  # of those, drafted enough to be judged
    flagged: int  # flags written


def group(requests: tuple[DraftedRequest, ...], settings: DetectorSettings) -> dict[Labels, list[DraftedRequest]]:
    series = defaultdict(list)
    for r in requests:
        if r.drafted >= settings.anomalies.min_drafted_tokens:
            series[series_labels(r, settings.drift)].append(r)
    return series


def with_history(engine: Engine, labels: Labels, new: list[DraftedRequest], settings: DetectorSettings) -> list:
    """The series' last `history` requests before its first new one, then the new ones."""
    s, first = settings.anomalies, new[0]
    if s.history == 0:
        return new
    key = (first.instance, first.model, first.drafter)
    older = recent_drafted(engine, key, first.id, s.history, s.min_drafted_tokens)
    return [r for r in older if series_labels(r, settings.drift) == labels] + new


def flag_rows(flags: list[Flag], now: float) -> list[dict]:
    return [
        {
            "request_id": f.request.request_id,
            "flag": f.flag,
            "started_at": f.request.started_at,
            "instance": f.request.instance,
            "model": f.request.model,
            "drafter": f.request.drafter,
            "value": f.request.acceptance,
            "expected": f.expected,
            "detail": f.detail,
            "flagged_at": now,
        }
        for f in flags
    ]


def save_flags(conn: Connection, rows: list[dict]) -> None:
    """Upsert by (request_id, flag): a request read again (a reset cursor) keeps one row per flag."""
    if rows:
        ids = sorted({r["request_id"] for r in rows})
        conn.execute(delete(request_flags).where(request_flags.c.request_id.in_(ids)))
        conn.execute(insert(request_flags), rows)


def run_pass(engine: Engine, settings: DetectorSettings, now: float) -> AnomalyPass:
    """Read the drafted requests after the cursor, flag them against their series, save flags and cursor."""
    with engine.connect() as conn:
        position = cursor(conn, KIND)
    if position is None:
        position = cursor_start(engine, now - settings.drift.initial_lookback)
    requests, last = drafted_since(engine, position, settings.drift.max_rows_per_cycle)
    series, flags = group(requests, settings), []
    for labels, new in series.items():
        population = {labels: with_history(engine, labels, new, settings)}
        flags += flag(population, {r.request_id for r in new}, settings.anomalies)
    with write_transaction(engine) as conn:
        save_flags(conn, flag_rows(flags, now))
        save_cursor(conn, KIND, last)
    return AnomalyPass(len(requests), sum(len(v) for v in series.values()), len(flags))
