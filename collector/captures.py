"""The captures table (telemetry.capture; issue 56): store, read for export, expire.

Each text is cut again to MAX_CAPTURE_CHARS by the contract (a producer may be hostile), the collector's
own redaction regexes run before the write, and the table holds at most `max_total_chars` of text: past
it, new captures are refused (counted), never older ones overwritten. A capture lives until the earlier of
its producer's `expires_at` and the collector's own cap (`SPECWATCH_CAPTURE_RETENTION_DAYS`).
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, delete, func, select
from sqlalchemy.exc import IntegrityError

from specwatch.collector.db import write_transaction
from specwatch.collector.models import CaptureRow
from specwatch.telemetry.capture import MAX_CAPTURE_CHARS, Capture, Redactor, capped
from specwatch.telemetry.schema import MAX_NAME_CHARS

EXPORT_PAGE = 500  # captures per read page (GET /v1/captures `limit` at most this)
NONE = "none"  # a filter's value for "without this tag"


@dataclass(frozen=True)
class CaptureCounts:
    stored: int = 0
    duplicates: int = 0
    over_cap: int = 0  # refused: the table holds its total of text


@dataclass(frozen=True)
class CaptureFilter:
    """Which captures a read returns: a slice (tenant, scenario tag, drafter, model, prompt-length band),
    only those below an acceptance, after an id (paging). `tenant` or `scenario` "none": captures without
    that tag (as `drafter=none` in the query API's filters)."""

    tenant: str | None = None
    scenario: str | None = None
    drafter: str | None = None
    model: str | None = None
    below_acceptance: float | None = None
    prompt_tokens: tuple[int, int] | None = None
    # the drift detector's series tag: the first of `tag_keys` a capture carries equals it ("none": none)
    series_tag: str | None = None
    tag_keys: tuple[str, ...] = ("scenario", "tenant")
    after_id: int = 0
    limit: int = EXPORT_PAGE


def scoped(capture: Capture, tenant: str) -> Capture:
    """A capture as a tenant-bound ingest token writes it: its tenant tag, its id scoped `tenant:id`."""
    capture_id = f"{tenant}:{capture.capture_id}"[:MAX_NAME_CHARS]
    return capture.model_copy(update={"capture_id": capture_id, "tags": {**capture.tags, "tenant": tenant}})


def store_captures(
    db: Engine,
    captures: list[Capture],
    *,
    max_total_chars: int,
    retention_s: float,
    redact: Redactor | None = None,
    lock: contextlib.AbstractContextManager | None = None,
    now: float | None = None,
) -> CaptureCounts:
    """Insert the captures not already stored, in one transaction, while the table's text fits. Two
    replicas storing the same id at once (PostgreSQL): the loser's transaction is retried, then sees it stored."""
    now = time.time() if now is None else now
    rows = [_row(c, redact, now, retention_s) for c in captures]
    try:
        return _insert(db, rows, max_total_chars, lock)
    except IntegrityError:  # another writer stored one of these ids between our read and our insert
        return _insert(db, rows, max_total_chars, lock)


def _insert(db: Engine, rows: list[dict], max_total_chars: int, lock) -> CaptureCounts:
    stored = duplicates = over_cap = 0
    with lock or contextlib.nullcontext(), write_transaction(db) as conn:
        held = conn.scalar(select(func.coalesce(func.sum(CaptureRow.chars), 0)))
        known = set(
            conn.scalars(
                select(CaptureRow.capture_id).where(CaptureRow.capture_id.in_([r["capture_id"] for r in rows]))
            )
        )
        fresh = []
        for row in rows:
            if row["capture_id"] in known:
                duplicates += 1
            elif held + row["chars"] > max_total_chars:
                over_cap += 1
            else:
                known.add(row["capture_id"])
                held += row["chars"]
                fresh.append(row)
        if fresh:
            conn.execute(CaptureRow.__table__.insert(), fresh)
        stored = len(fresh)
    return CaptureCounts(stored, duplicates, over_cap)


def _row(capture: Capture, redact: Redactor | None, now: float, retention_s: float) -> dict:
    prompt, output, redactions = [m.model_dump() for m in capture.prompt], capture.output, capture.redactions
    if redact is not None and (redact.patterns or redact.hook):
        prompt, output, redactions = _redacted(prompt, output, redact, redactions)
    chars = sum(len(m["content"]) for m in prompt) + len(output)
    return {
        **capture.model_dump(exclude={"prompt", "output", "redactions", "expires_at"}),
        "tenant": capture.tenant,
        "prompt": prompt,
        "output": output,
        "redactions": redactions,
        "chars": chars,
        "stored_at": now,
        "expires_at": min(capture.expires_at, now + retention_s),
    }


def _redacted(prompt: list[dict], output: str, redact: Redactor, count: int) -> tuple[list[dict], str, int]:
    """The collector's own redaction over texts a producer sent (a replacement may lengthen one: cut again)."""
    messages = []
    for message in prompt:
        text, n = redact(message["content"])
        messages.append({"role": message["role"], "content": capped(text, MAX_CAPTURE_CHARS)[0]})
        count += n
    text, n = redact(output)
    return messages, capped(text, MAX_CAPTURE_CHARS)[0], count + n


def read_captures(db: Engine, where: CaptureFilter) -> tuple[list[dict], int | None]:
    """One page of captures in id order, as plain dicts (the admin export's rows), and the id to read the
    next page after (None: this was the last page)."""
    query = select(CaptureRow).where(CaptureRow.id > where.after_id).order_by(CaptureRow.id).limit(where.limit)
    if where.tenant is not None:
        query = query.where(CaptureRow.tenant.is_(None) if where.tenant == NONE else CaptureRow.tenant == where.tenant)
    for column, value in ((CaptureRow.drafter, where.drafter), (CaptureRow.model, where.model)):
        if value is not None:
            query = query.where(column == value)
    if where.prompt_tokens is not None:
        query = query.where(CaptureRow.prompt_tokens.between(*where.prompt_tokens))
    if where.below_acceptance is not None:
        rate = CaptureRow.num_accepted_tokens * 1.0 / CaptureRow.num_draft_tokens
        query = query.where(CaptureRow.num_draft_tokens > 0, rate < where.below_acceptance)
    with db.connect() as conn:
        rows = conn.execute(query).mappings().all()
    found = [_public(row) for row in rows]
    if where.scenario is not None:  # a JSON tag: filtered here (the page may come back short; paging goes on by id)
        wanted = None if where.scenario == NONE else where.scenario
        found = [c for c in found if c["tags"].get("scenario") == wanted]
    if where.series_tag is not None:
        found = [c for c in found if series_tag(c["tags"], where.tag_keys) == where.series_tag]
    return found, (rows[-1]["id"] if len(rows) == where.limit else None)


@dataclass(frozen=True)
class CapturedKey:
    """What a slice count needs of one capture: no text."""

    drafter: str
    model: str
    tenant: str | None
    scenario: str | None
    prompt_tokens: int


def exportable_keys(db: Engine, drafters: set[str], now: float) -> list[CapturedKey]:
    """The unexpired captures of `drafters` that `specwatch draft export` writes (chat, with an output),
    without their text (`collector.reads.slices` counts them per slice)."""
    if not drafters:
        return []
    columns = (CaptureRow.drafter, CaptureRow.model, CaptureRow.tenant, CaptureRow.tags, CaptureRow.prompt_tokens)
    query = select(*columns).where(
        CaptureRow.drafter.in_(sorted(drafters)),
        CaptureRow.kind == "chat",
        CaptureRow.output != "",
        CaptureRow.expires_at > now,
    )
    with db.connect() as conn:
        rows = conn.execute(query).all()
    return [CapturedKey(d, m, t, (tags or {}).get("scenario"), n) for d, m, t, tags, n in rows]


def series_tag(tags: dict[str, str], keys: tuple[str, ...]) -> str:
    """The tag value a drift series is keyed by (alerts.baselines.series_labels): the first of `keys` present."""
    return next((str(tags[k]) for k in keys if k in tags), "none")


def _public(row) -> dict:
    return {key: value for key, value in row.items() if key != "chars"}


def expire_captures(conn: Connection, now: float) -> int:
    """Delete the captures whose retention ended (the collector's retention pass calls it). Returns the count."""
    return conn.execute(delete(CaptureRow).where(CaptureRow.expires_at <= now)).rowcount
