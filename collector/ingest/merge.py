"""One request, two producers: the merge rule (issue 52 item 5, issue 57).

A request proxied by a specwatch gateway to a specwatch engine is reported by both, under one
`request_id` and `started_at` (the gateway sends them as `x-request-id` and `x-specwatch-started-at`)
and one instance (the engine's name, `x-specwatch-instance`; the gateway keeps the upstream's in the
`upstream` tag). The gateway's record is the one tagged `gateway`. Whichever arrives first is stored;
when the other arrives, the stored row becomes the merge of the two, the same in either order:

- the engine's fields win: it ran the request, so its queue time, tokens, mode, drafter, acceptance
  counts, draft and verify time, energy, device time and load are what happened; a gateway's mode and
  drafter are only those its upstream declared;
- but TTFT and e2e are the gateway's where it measured them: the client talks to the gateway, so its
  clock is what the client's clock says (the hop and the gateway's own delays included);
- the gateway's routing fields are kept: `arm` and `mode_reason` (where it set them: an arm, a reason
  other than `default`), and its tags (`gateway`, `upstream`) over the engine's;
- status and error are the engine's, unless the engine finished well and the gateway saw the request
  fail on its way to the client (a stream cut, a timeout): then the gateway's;
- retries: the larger count; device time: the engine's, the gateway's estimate only where it has none.

Two records of one producer that differ stay a conflict (store.IngestCounts.conflicts), never merged.
A merge changes the stored row, so the per-second aggregates of its second are rebuilt from the raw
rows in the same transaction (on PostgreSQL under a per-second advisory lock, the delete and the
read of the raw rows in one statement: one snapshot, so a concurrent batch is counted once).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import orjson

from specwatch.collector.models import Request
from specwatch.collector.tiers import aggregates
from specwatch.telemetry.schema import GATEWAY_TAG

COLUMNS = [c.name for c in Request.__table__.columns if c.name != "id"]
JSON_COLUMNS = ("accepted_per_position", "drafts_per_position", "tags")
MERGE_LOCK = 0x5357  # the first key of the two-key advisory locks a merge takes, one per second
_AGG = aggregates.WindowAggregate.__tablename__


def merged(engine: dict[str, Any], gateway: dict[str, Any]) -> dict[str, Any]:
    """The row of one request from its engine's record and its gateway's (the module doc's rule)."""
    row = dict(engine)
    row["arm"] = gateway["arm"] if gateway["arm"] is not None else engine["arm"]
    row["mode_reason"] = gateway["mode_reason"] if gateway["mode_reason"] != "default" else engine["mode_reason"]
    if engine["status"] == "ok" and gateway["status"] != "ok":
        row["status"], row["error"] = gateway["status"], gateway["error"]
    row["retries"] = max(engine["retries"], gateway["retries"])
    row["tags"] = {**(engine["tags"] or {}), **(gateway["tags"] or {})}
    for timing in ("ttft_s", "e2e_s"):
        if gateway[timing] is not None:
            row[timing] = gateway[timing]
    if engine["device_s"] is None:
        row["device_s"], row["device_s_source"] = gateway["device_s"], gateway["device_s_source"]
    return row


def pair(incoming: dict[str, Any], stored: dict[str, Any]) -> tuple[dict, dict] | None:
    """(engine's, gateway's) when the two are one request reported by an engine and a gateway, else None."""
    gateways = [GATEWAY_TAG in (row["tags"] or {}) for row in (incoming, stored)]
    if gateways[0] == gateways[1] or incoming["instance"] != stored["instance"]:
        return None
    return (stored, incoming) if gateways[0] else (incoming, stored)


def merge_producers(cursor, records: Sequence[Any], new: Sequence[Any], sqlite: bool) -> int:
    """Merge the batch's duplicates (`records` not in `new`) reported by the other producer into the
    stored rows; returns the rows changed."""
    fresh = {id(record) for record in new}
    duplicates = [record for record in records if id(record) not in fresh]
    if not duplicates:
        return 0
    stored = _stored(cursor, sorted({record.request_id for record in duplicates}), sqlite)
    changed: dict[int, dict] = {}
    for record in duplicates:
        incoming = {name: record.__dict__[name] for name in COLUMNS}
        key = (incoming["request_id"], incoming["started_at"])
        if (found := stored.get(key)) is None or (both := pair(incoming, found[1])) is None:
            continue
        row = merged(*both)
        if row != found[1]:
            stored[key] = (found[0], row)  # a third report merges with this one
            changed[found[0]] = row
    if changed:
        _update(cursor, changed, sqlite)
        seconds = {int(row["started_at"] // aggregates.PERIOD_S) for row in changed.values()}
        _rebuild_aggregates(cursor, sorted(seconds), sqlite)
    return len(changed)


def _stored(cursor, request_ids: list[str], sqlite: bool, chunk: int = 500) -> dict[tuple, tuple[int, dict]]:
    """The stored rows of these ids, by (request_id, started_at): (row id, columns decoded)."""
    rows = {}
    for start in range(0, len(request_ids), chunk):
        ids = request_ids[start : start + chunk]
        where = f"IN ({', '.join('?' * len(ids))})" if sqlite else "= ANY(%s)"
        query = f"SELECT id, {', '.join(COLUMNS)} FROM requests WHERE request_id {where}"
        cursor.execute(query, ids if sqlite else (ids,))
        for found in cursor.fetchall():
            row = dict(zip(COLUMNS, found[1:]))
            for name in JSON_COLUMNS:
                if isinstance(row[name], (str, bytes)):
                    row[name] = orjson.loads(row[name])
            rows[row["request_id"], row["started_at"]] = (found[0], row)
    return rows


def _update(cursor, changed: dict[int, dict], sqlite: bool) -> None:
    mark = "?" if sqlite else "%s"
    value = {name: f"CAST({mark} AS json)" if not sqlite and name in JSON_COLUMNS else mark for name in COLUMNS}
    assignments = ", ".join(f"{name} = {value[name]}" for name in COLUMNS)
    params = [
        [orjson.dumps(row[name]).decode() if name in JSON_COLUMNS else row[name] for name in COLUMNS] + [row_id]
        for row_id, row in changed.items()
    ]
    cursor.executemany(f"UPDATE requests SET {assignments} WHERE id = {mark}", params)


def _rebuild_aggregates(cursor, seconds: list[int], sqlite: bool) -> None:
    """Replace the stored aggregates of these seconds with those of their raw rows as they are now."""
    lo, hi = seconds[0] * aggregates.PERIOD_S, (seconds[-1] + 1) * aggregates.PERIOD_S
    fields = ", ".join(aggregates.SOURCE_FIELDS)
    mark = "?" if sqlite else "%s"
    raw = f"SELECT {fields} FROM requests WHERE started_at >= {mark} AND started_at < {mark}"
    if sqlite:  # one writer at a time: the delete and the read need no common snapshot
        cursor.execute(f"DELETE FROM {_AGG} WHERE period_start IN ({', '.join('?' * len(seconds))})", seconds)
        cursor.execute(raw, (lo, hi))
    else:
        for second in seconds:  # in order: two merges of overlapping seconds cannot deadlock
            cursor.execute("SELECT pg_advisory_xact_lock(%s, %s)", (MERGE_LOCK, second % 2**31))
        cursor.execute(f"WITH gone AS (DELETE FROM {_AGG} WHERE period_start = ANY(%s)) {raw}", (seconds, lo, hi))
    wanted = set(seconds)
    rows = [row for row in cursor.fetchall() if int(row[0] // aggregates.PERIOD_S) in wanted]
    if rows:
        columns = aggregates.columns_of_rows(rows, aggregates.SOURCE_FIELDS)
        keys, totals = aggregates.aggregate(columns, aggregates.LABELS, per_second=True)
        aggregates.insert_rows(cursor, aggregates.stored_rows(keys, totals), sqlite)
