"""Per-request reads: one series' recent drafted requests (the anomaly pass, `alerts.anomaly_pass`),
the Requests listing (filters, sort, keyset pages) and one request's detail (`GET /v1/requests`).
"""

from __future__ import annotations

import base64
import json
from collections import defaultdict
from dataclasses import dataclass

from sqlalchemy import JSON, Connection, Engine, Select, column, func, literal_column, select, table, tuple_

from specwatch.collector.models import ACCEPTANCE_SQL, Request
from specwatch.collector.reads.detector_reads import _DRAFTED_COLUMNS, DraftedRequest, _drafted
from specwatch.collector.reads.queries import Filters, Window
from specwatch.telemetry import ratios


def recent_drafted(
    db: Engine, series: tuple[str, str, str | None], before_id: int, limit: int, min_drafted: int
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
    with db.connect() as conn:
        rows = conn.execute(stmt.order_by(Request.id.desc()).limit(limit)).all()
    return tuple(_drafted(row) for row in reversed(rows))


ACCEPTANCE = literal_column(ACCEPTANCE_SQL)  # the expression ix_requests_acceptance indexes, repeated exactly
SORTS = {"time": Request.started_at, "ttft": Request.ttft_s, "e2e": Request.e2e_s, "acceptance": ACCEPTANCE}
WHOLE_WINDOW_ROWS = 30_000  # a window this small is read by time and sorted whole
COUNT_CAP = 100_000  # past this many rows in the window a walk wins anyway: counting stops there
PROBE_ROWS = 2_000  # the window's latest rows that estimate the filters' share
FLAGS = ("outlier", "repetition", "collapse", "any")
STATUSES = ("ok", "error", "cancelled")
# request_flags is the alerts' table (alerts/tables.py, migration 0012); the collector reads two columns
_flags = table("request_flags", column("request_id"), column("flag"), column("started_at"))
_flag_detail = table(
    "request_flags", *(column(c) for c in ("request_id", "flag", "value", "expected")), column("detail", JSON)
)


class BadCursor(ValueError):
    """A page cursor this listing did not hand out (or one for another sort)."""


@dataclass(frozen=True)
class RequestQuery:
    """What to list: `sort` one of SORTS (rows without that value are left out), `status`, `flag`
    (one of FLAGS), a page of `limit` rows after `cursor` (the previous page's `next_cursor`)."""

    sort: str = "time"
    descending: bool = True
    status: str | None = None
    flag: str | None = None
    limit: int = 50
    cursor: str | None = None


@dataclass(frozen=True)
class RequestRow:
    request_id: str
    started_at: float
    instance: str
    model: str
    drafter: str | None
    mode: str
    mode_reason: str  # why the policy chose `mode` (default, canary, load, long_prompt, ...)
    status: str
    ttft_s: float | None
    e2e_s: float
    output_tokens: int
    acceptance: float | None
    flags: tuple[str, ...] = ()


@dataclass(frozen=True)
class RequestPage:
    rows: tuple[RequestRow, ...]
    next_cursor: str | None  # None on the last page


_ROW_COLUMNS = (
    Request.request_id,
    Request.started_at,
    Request.instance,
    Request.model,
    Request.drafter,
    Request.mode,
    Request.mode_reason,
    Request.status,
    Request.ttft_s,
    Request.e2e_s,
    Request.output_tokens,
    ACCEPTANCE.label("acceptance"),
)


def encode_cursor(sort: str, value: float, row_id: int) -> str:
    return base64.urlsafe_b64encode(json.dumps([sort, value, row_id]).encode()).decode()


def decode_cursor(cursor: str, sort: str) -> tuple[float, int]:
    try:
        kind, value, row_id = json.loads(base64.urlsafe_b64decode(cursor.encode()))
    except (ValueError, TypeError, RecursionError) as exc:
        raise BadCursor("cursor is not one this listing handed out") from exc
    if kind != sort or not _finite(value) or type(row_id) is not int or not 0 <= row_id < 2**63:
        raise BadCursor(f"cursor is not one of a listing sorted by {sort}")
    return float(value), row_id


def _finite(value: object) -> bool:
    """A sort value a listing can hand out (epoch or latency seconds, a rate): a huge int would
    overflow the database's bind parameter."""
    return type(value) in (int, float) and abs(value) <= 1e12


def _flagged(window: Window, flag: str) -> Select:
    f = _flags.c
    flagged = select(f.request_id).where(f.started_at >= window.start, f.started_at < window.end)
    return flagged if flag == "any" else flagged.where(f.flag == flag)


def _matching(columns: tuple, window: Window, filters: Filters, q: RequestQuery, time_index: bool) -> Select:
    """The rows in the window that pass every filter (the sort's value known)."""
    key = SORTS[q.sort]
    stmt = filters.apply(select(*columns), window, time_index)
    stmt = stmt.where(key >= 0) if q.sort != "time" else stmt  # a range: an index walk skips NULLs
    if q.status is not None:
        stmt = stmt.where(Request.status == q.status)
    if q.flag is not None:
        stmt = stmt.where(Request.request_id.in_(_flagged(window, q.flag)))
    return stmt


def walk_sort_index(conn: Connection, window: Window, filters: Filters, q: RequestQuery) -> bool:
    """Whether a page reads fewer rows walking the sort's index (skipping rows that fail the filters)
    than reading the whole window by time and sorting it: rows in the window W (at most COUNT_CAP);
    the share f of its latest PROBE_ROWS that pass the filters; a walk reads ~ limit * stored / (f * W)
    rows, the window read ~ W."""
    if q.sort == "time":
        return True
    time_range = (Request.started_at >= window.start, Request.started_at < window.end)
    counted = select(Request.id).where(*time_range).limit(COUNT_CAP).subquery()  # an index-only count, capped
    in_window = conn.scalar(select(func.count()).select_from(counted))
    if in_window <= WHOLE_WINDOW_ROWS:
        return False
    latest = select(Request.id).where(*time_range).order_by(Request.started_at.desc()).limit(PROBE_ROWS)
    probe = _matching((func.count(),), window, filters, q, False).where(Request.id.in_(latest.scalar_subquery()))
    share = conn.scalar(probe) / min(PROBE_ROWS, in_window)
    newest, oldest = (conn.scalar(select(f(Request.id))) for f in (func.max, func.min))  # one each: an index seek
    stored = newest - oldest + 1
    return q.limit * stored < max(share * in_window, 1.0) * in_window


def _listing(window: Window, filters: Filters, q: RequestQuery, walk: bool) -> Select:
    """The query for one page: the filters, the sort's value and id in order, after the cursor. `walk`
    keeps the planner off the time index (`Filters.apply`'s `started_at + 0`) for a metric sort."""
    key, by_time = SORTS[q.sort], q.sort == "time" or not walk
    stmt = _matching((*_ROW_COLUMNS, Request.id, key.label("sort_key")), window, filters, q, by_time)
    if q.cursor is not None:  # `+ 0` when reading by time: a range on the sort's index would lure the planner
        after = tuple_(key if walk else key + 0, Request.id)
        value, row_id = decode_cursor(q.cursor, q.sort)
        stmt = stmt.where(after < tuple_(value, row_id) if q.descending else after > tuple_(value, row_id))
    order = (key.desc(), Request.id.desc()) if q.descending else (key.asc(), Request.id.asc())
    return stmt.order_by(*order).limit(q.limit + 1)


def flags_of(conn, request_ids: list[str]) -> dict[str, tuple[str, ...]]:
    found = defaultdict(list)
    if request_ids:
        stmt = select(_flags.c.request_id, _flags.c.flag).where(_flags.c.request_id.in_(request_ids))
        for request_id, name in conn.execute(stmt.order_by(_flags.c.flag)):
            found[request_id].append(name)
    return {k: tuple(v) for k, v in found.items()}


def _row(r, flags: tuple[str, ...]) -> RequestRow:
    *head, acceptance = r[: len(_ROW_COLUMNS)]  # PostgreSQL computes acceptance as numeric
    return RequestRow(*head, float(acceptance) if acceptance is not None else None, flags)


def list_requests(db: Engine, window: Window, filters: Filters, q: RequestQuery) -> RequestPage:
    """One page of the requests in the window that pass the filters, in the sort's order (keyset pages:
    a sort walks its index when matches are dense enough, else the window is read by time and sorted)."""
    with db.connect() as conn:
        rows = conn.execute(_listing(window, filters, q, walk_sort_index(conn, window, filters, q))).all()
        page = rows[: q.limit]
        flags = flags_of(conn, [r.request_id for r in page])
    found = tuple(_row(r, flags.get(r.request_id, ())) for r in page)
    last = page[-1] if page else None
    more = len(rows) > q.limit and last is not None
    return RequestPage(found, encode_cursor(q.sort, float(last.sort_key), int(last.id)) if more else None)


@dataclass(frozen=True)
class FlagDetail:
    flag: str
    value: float  # the request's acceptance
    expected: float  # its series' median
    detail: dict


@dataclass(frozen=True)
class RequestDetail:
    """One stored request: every contract field, per-position acceptance and its flags."""

    record: dict
    acceptance: float | None
    mean_acceptance_length: float | None
    # position i: share of the drafts that reached it (drafts_per_position[i]; every draft when the producer
    # did not count them) whose tokens 0..i were all accepted
    position_acceptance: tuple[float, ...]
    tpot_s: float | None
    flags: tuple[FlagDetail, ...]


def _detail(record: dict, flags: tuple[FlagDetail, ...]) -> RequestDetail:
    drafts, drafted, accepted = record["num_drafts"], record["num_draft_tokens"], record["num_accepted_tokens"]
    accepted_at, reached = record["accepted_per_position"] or (), record.get("drafts_per_position") or ()
    if not drafts:
        per_position = ()
    elif reached:  # positions no draft reached (a zero tail: the list is non-increasing) have no rate
        per_position = tuple(n / r for n, r in zip(accepted_at, reached) if r)
    else:
        per_position = tuple(n / drafts for n in accepted_at)
    ttft, out = record["ttft_s"], record["output_tokens"]
    tpot = (record["e2e_s"] - ttft) / (out - 1) if ttft is not None and out > 1 else None
    length = ratios.mean_acceptance_length(accepted, drafts)
    return RequestDetail(record, ratios.acceptance_rate(accepted, drafted), length, per_position, tpot, flags)


def request_detail(db: Engine, request_id: str) -> RequestDetail | None:
    """The request with this id (the first stored, when two instances share it), else None."""
    columns = [c for c in Request.__table__.columns if c.name != "id"]
    stmt = select(*columns).where(Request.request_id == request_id).order_by(Request.id).limit(1)
    f = _flag_detail.c
    with db.connect() as conn:
        row = conn.execute(stmt).mappings().first()
        flags = conn.execute(select(f.flag, f.value, f.expected, f.detail).where(f.request_id == request_id))
        found = tuple(FlagDetail(n, float(v), float(e), dict(d or {})) for n, v, e, d in flags)
    return _detail(dict(row), found) if row is not None else None
