"""The anomaly pass on the leader: judge each new drafted request once against its series
(`alerts.anomalies`) and write its flags to `request_flags`, with the pass's cursor, in one transaction.

A series is the drift detector's (`alerts.baselines.series_labels`: model, drafter, instance, tag). A new
request is judged with the other new requests of its series and the series' last `history` requests
before them (`collector.reads.request_reads.recent_drafted`), so a flag needs no warm state in memory.
A request started after its instance's latest deploy marker, with a drafter new since then, is also
judged against the instance and model's requests in the regression's `side` before the marker
(`alerts.anomalies.new_drafter_collapse`): one read per (instance, model) and pass, only when such a
request is new.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, delete, insert

from specwatch.alerts.anomalies import Flag, MarkerBaseline, flag, marker_baseline, new_drafter_collapse
from specwatch.alerts.baselines import series_labels
from specwatch.alerts.detector_settings import DetectorSettings
from specwatch.alerts.detector_store import Labels, cursor, save_cursor
from specwatch.alerts.regression import latest_markers
from specwatch.alerts.tables import request_flags
from specwatch.collector.db import write_transaction
from specwatch.collector.reads.detector_reads import (
    DraftedRequest,
    Marker,
    cursor_start,
    drafted_since,
    instance_drafted,
)
from specwatch.collector.reads.queries import Window
from specwatch.collector.reads.request_reads import recent_drafted

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


def with_history(db: Engine, labels: Labels, new: list[DraftedRequest], settings: DetectorSettings) -> list:
    """The series' last `history` requests before its first new one, then the new ones."""
    s, first = settings.anomalies, new[0]
    if s.history == 0:
        return new
    key = (first.instance, first.model, first.drafter)
    older = recent_drafted(db, key, first.id, s.history, s.min_drafted_tokens)
    return [r for r in older if series_labels(r, settings.drift) == labels] + new


def read_baseline(db: Engine, marker: Marker, model: str, settings: DetectorSettings) -> MarkerBaseline | None:
    """The instance and model's drafted requests in the `side` before the marker."""
    side, floor = settings.regression.side, settings.anomalies.min_drafted_tokens
    before = instance_drafted(db, marker.instance, Window(marker.at - side, marker.at), floor)
    return marker_baseline(marker.at, side, [r for r in before if r.model == model])


def marker_flags(db: Engine, new: list[DraftedRequest], done: list[Flag], settings, now: float) -> list[Flag]:
    """`collapse` of new requests whose drafter is new since their instance's latest marker."""
    collapsed = {f.request.request_id for f in done if f.flag == "collapse"}
    markers = {m.instance: m for m, _ in latest_markers(db, settings.regression, now)} if new else {}
    candidates = [
        r
        for r in new
        if r.instance in markers and r.started_at >= markers[r.instance].at and r.request_id not in collapsed
    ]
    baselines, found = {}, []
    for r in candidates:
        key = (r.instance, r.model)
        if key not in baselines:
            baselines[key] = read_baseline(db, markers[r.instance], r.model, settings)
        hit = baselines[key] and new_drafter_collapse(r, baselines[key], settings.anomalies)
        found += [hit] if hit else []
    return found


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


def run_pass(db: Engine, settings: DetectorSettings, now: float) -> AnomalyPass:
    """Read the drafted requests after the cursor, flag them against their series, save flags and cursor."""
    with db.connect() as conn:
        position = cursor(conn, KIND)
    if position is None:
        position = cursor_start(db, now - settings.drift.initial_lookback)
    requests, last = drafted_since(db, position, settings.drift.max_rows_per_cycle)
    series, flags = group(requests, settings), []
    for labels, new in series.items():
        population = {labels: with_history(db, labels, new, settings)}
        flags += flag(population, {r.request_id for r in new}, settings.anomalies)
    flags += marker_flags(db, [r for new in series.values() for r in new], flags, settings, now)
    with write_transaction(db) as conn:
        save_flags(conn, flag_rows(flags, now))
        save_cursor(conn, KIND, last)
    return AnomalyPass(len(requests), sum(len(v) for v in series.values()), len(flags))
