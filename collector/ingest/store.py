"""Bulk, idempotent writes of ingest batches.

The hot path skips the ORM on purpose (SQLAlchemy Core costs ~4x raw executemany):
SQLite gets `INSERT OR IGNORE` through the driver's `executemany`, PostgreSQL a binary
`COPY` into a temporary table followed by `INSERT ... SELECT ... ON CONFLICT DO NOTHING`.
Either way a batch is one transaction, and a row whose key is already stored (or
appears earlier in the same batch) is skipped and counted as a duplicate; a duplicate that is the
other producer's report of one request (an engine's and its gateway's) is merged into the stored row
by the one rule of collector.ingest.merge.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter
from typing import Any

import orjson
from sqlalchemy import Engine, Table
from sqlalchemy.exc import DBAPIError
from sqlalchemy.types import JSON, BigInteger, Boolean, Double, Integer, String

from specwatch.collector.db import INGEST_BUSY_S, write_transaction
from specwatch.collector.ingest import merge
from specwatch.collector.models import DeviceSampleRow, EngineEventRow, Request
from specwatch.collector.tiers import aggregates
from specwatch.telemetry.schema import GATEWAY_TAG, DeviceSample, IngestBatch, RequestRecord


def _classify(exc: Exception, dbapi: Any) -> Exception:
    """DataError/IntegrityError: the batch's data (validation should have caught it) -> 4xx;
    anything else from the database (down, locked, schema missing) -> retry later (503)."""
    orig = getattr(exc, "orig", None) or exc
    message = str(orig).splitlines()[0] if str(orig) else type(orig).__name__
    if isinstance(orig, (dbapi.DataError, dbapi.IntegrityError)):
        return DataRejected(message)
    return StoreUnavailable(message)


_PG_TYPES = {Double: "float8", BigInteger: "int8", Integer: "int4", String: "text", Boolean: "bool", JSON: "json"}


class DataRejected(ValueError):
    """The database refused a validated batch for what it holds (the batch was rolled back)."""


class StoreUnavailable(RuntimeError):
    """The database could not take the batch right now (down, locked, misconfigured): retry later."""


@dataclass(frozen=True)
class IngestCounts:
    """What one batch did: rows stored and rows skipped as already present, per kind.

    `new_requests` / `new_samples` are the records actually stored (for /metrics, which
    must not count a resent record twice).
    """

    requests: int = 0
    request_duplicates: int = 0
    samples: int = 0
    sample_duplicates: int = 0
    events: int = 0
    event_duplicates: int = 0
    new_requests: tuple[RequestRecord, ...] = field(default=(), repr=False)
    new_samples: tuple[DeviceSample, ...] = field(default=(), repr=False)
    # Duplicate requests whose payload differs from the stored one (a subset of `request_duplicates`),
    # and the first `MAX_CONFLICT_IDS` of their ids.
    conflicts: int = 0
    conflict_ids: tuple[str, ...] = ()

    @property
    def accepted(self) -> int:
        return self.requests + self.samples + self.events

    @property
    def duplicates(self) -> int:
        return self.request_duplicates + self.sample_duplicates + self.event_duplicates


MAX_CONFLICT_IDS = 10


class _TableSpec:
    """How records of one kind become rows of one table (every column but `id`).

    Column names equal the schema's field names, so a row is read straight out of the
    pydantic instance's `__dict__` (several times faster than per-attribute access).
    """

    def __init__(self, table: Table, conflict: Sequence[str]) -> None:
        self.table = table
        self.columns = [c.name for c in table.columns if c.name != "id"]
        self.conflict = tuple(conflict)  # the unique key ON CONFLICT names
        self.json_positions = [i for i, c in enumerate(self.columns) if isinstance(table.columns[c].type, JSON)]
        self._get_values = itemgetter(*self.columns)
        self._get_key = attrgetter(*self.conflict)
        self.pg_types = [_pg_type(table.columns[c].type) for c in self.columns]

    def key(self, record: Any) -> Any:
        return self._get_key(record)

    def rows(self, records: Sequence[Any], encode: Callable[[Any], Any]) -> list[list[Any]]:
        """Column-ordered rows; JSON columns go through `encode` (text for SQLite, objects for COPY)."""
        get_values, json_positions = self._get_values, self.json_positions
        out = []
        for record in records:
            values = list(get_values(record.__dict__))
            for i in json_positions:
                values[i] = encode(values[i])
            out.append(values)
        return out


def _pg_type(sql_type: Any) -> str:
    for cls, name in _PG_TYPES.items():
        if isinstance(sql_type, cls):
            return name
    raise TypeError(f"no COPY type for {sql_type!r}")


REQUESTS = _TableSpec(Request.__table__, ["request_id"])
# On PostgreSQL `requests` is partitioned by day and its unique key includes the partition key
# (`collector.tiers.partitions` says why a resend still has the same key).
PG_REQUESTS = _TableSpec(Request.__table__, ["request_id", "started_at"])
SAMPLES = _TableSpec(DeviceSampleRow.__table__, ["instance", "device", "at"])
EVENTS = _TableSpec(EngineEventRow.__table__, ["instance", "kind", "at"])


def _json_text(value: Any) -> str:
    return orjson.dumps(value).decode()


def _identity(value: Any) -> Any:
    return value


class Store:
    """Writes validated batches; safe to share between threads."""

    def __init__(self, db: Engine) -> None:
        self.db = db
        self.is_sqlite = db.dialect.name == "sqlite"
        # SQLite has one writer at a time; queueing here beats spinning on SQLITE_BUSY. Writers in
        # other processes (the ingest workers) queue on SQLite's busy timeout instead (measured:
        # a cross-process file lock did not ingest faster).
        self._write_lock = threading.Lock() if self.is_sqlite else None
        self.health = WriteHealth(self)  # the service's: ingest reports to it, /readyz asks it

    def write_lock(self) -> contextlib.AbstractContextManager:
        """Held by every writer on SQLite (ingest, roll-ups, retention); a no-op on PostgreSQL."""
        return self._write_lock if self._write_lock is not None else contextlib.nullcontext()

    def probe_write(self, timeout_s: float = 1.0) -> str | None:
        """Commit one tiny write, waiting at most ~`timeout_s` for locks: None when the database takes
        writes, else why not. TimeoutError: this process's own writer held the lock all along (no verdict).
        The write must reach the disk (a rolled-back or no-op change writes nothing there): SQLite bumps
        its `user_version` header field (unused otherwise), PostgreSQL rewrites alembic_version's row."""
        lock = self._write_lock
        if lock is not None and not lock.acquire(timeout=timeout_s):
            raise TimeoutError("an ingest or maintenance write holds the write lock")
        dbapi = self.db.dialect.dbapi
        try:
            raw = self.db.raw_connection()
            try:
                (_probe_sqlite if self.is_sqlite else _probe_postgres)(raw, int(timeout_s * 1000))
            finally:
                raw.close()
        except (dbapi.Error, DBAPIError) as exc:
            return str(_classify(exc, dbapi))
        finally:
            if lock is not None:
                lock.release()
        return None

    def insert(self, batch: IngestBatch) -> IngestCounts:
        """Store a whole batch in one transaction and count what was new."""
        requests = REQUESTS if self.is_sqlite else PG_REQUESTS
        parts = ((requests, batch.requests), (SAMPLES, batch.samples), (EVENTS, batch.events))
        dbapi = self.db.dialect.dbapi
        try:
            if self._write_lock is None:
                stored, conflicts = self._write(parts, _postgres_copy)
            else:
                stored, conflicts = self._write_sqlite(parts)
        except (dbapi.Error, DBAPIError) as exc:
            raise _classify(exc, dbapi) from exc
        (req, n_req), (smp, n_smp), (evt, n_evt) = [(new, len(records)) for new, (_, records) in zip(stored, parts)]
        return IngestCounts(
            len(req),
            n_req - len(req),
            len(smp),
            n_smp - len(smp),
            len(evt),
            n_evt - len(evt),
            tuple(req),
            tuple(smp),
            len(conflicts),
            tuple(conflicts[:MAX_CONFLICT_IDS]),
        )

    def _write_sqlite(self, parts) -> tuple[list[list[Any]], list[str]]:
        """`_write` within INGEST_BUSY_S of waiting for the locks (this process's writers', then the
        database's), else StoreUnavailable: a 503 the producer gets before its own timeout."""
        waited = time.monotonic()
        if not self._write_lock.acquire(timeout=INGEST_BUSY_S):
            raise StoreUnavailable(f"the database is locked by another writer of this process ({INGEST_BUSY_S:g} s)")
        try:
            return self._write(parts, _sqlite_executemany, max(0.1, INGEST_BUSY_S - (time.monotonic() - waited)))
        finally:
            self._write_lock.release()

    def _write(self, parts, write_table, busy_s: float = INGEST_BUSY_S) -> tuple[list[list[Any]], list[str]]:
        """Each part's new records, and the ids of duplicate requests that differ from the stored ones."""
        with write_transaction(self.db, busy_s) as conn:
            cursor = conn.connection.dbapi_connection.cursor()
            try:
                stored = [write_table(cursor, spec, records) for spec, records in parts]
                aggregates.write_for_records(cursor, stored[0], self.is_sqlite)  # only the new requests
                conflicts = _conflicting_ids(cursor, parts[0][1], stored[0], self.is_sqlite)
                merge.merge_producers(cursor, parts[0][1], stored[0], self.is_sqlite)  # engine + gateway: one row
                return stored, conflicts
            finally:
                cursor.close()


def _probe_sqlite(raw, timeout_ms: int) -> None:
    cursor = raw.cursor()
    (busy_ms,) = cursor.execute("PRAGMA busy_timeout").fetchone()
    cursor.execute(f"PRAGMA busy_timeout = {timeout_ms}")
    try:
        cursor.execute("BEGIN IMMEDIATE")
        (version,) = cursor.execute("PRAGMA user_version").fetchone()
        cursor.execute(f"PRAGMA user_version = {(version + 1) % 2**31}")
        cursor.execute("COMMIT")
    finally:
        if raw.dbapi_connection.in_transaction:
            cursor.execute("ROLLBACK")
        cursor.execute(f"PRAGMA busy_timeout = {busy_ms}")
        cursor.close()


def _probe_postgres(raw, timeout_ms: int) -> None:
    try:
        with raw.cursor() as cursor:
            cursor.execute(f"SET LOCAL lock_timeout = {timeout_ms}")
            cursor.execute(f"SET LOCAL statement_timeout = {timeout_ms * 5}")
            cursor.execute("UPDATE alembic_version SET version_num = version_num")
        raw.commit()
    except BaseException:
        raw.rollback()
        raise


class WriteHealth:
    """Whether the store takes writes, for /readyz.

    Ingest reports each batch's outcome (`wrote`, `failed`). While the last write succeeded less than
    `fresh_s` ago that is the answer; otherwise (it failed, or nothing was written for a while) a probe
    write decides, at most once per `probe_every_s` however often /readyz is polled.
    """

    def __init__(self, store: Store, fresh_s: float = 30.0, probe_every_s: float = 1.0) -> None:
        self._store, self._fresh_s, self._probe_every_s = store, fresh_s, probe_every_s
        self._lock = threading.Lock()
        self._ok_at = self._probed_at = -math.inf
        self._failure: str | None = None

    def wrote(self) -> None:
        with self._lock:
            self._ok_at, self._failure = time.monotonic(), None

    def failed(self, reason: str) -> None:
        with self._lock:
            self._failure = reason

    def problem(self) -> str | None:
        """None when the store takes writes, else the error of the last write (or probe) that failed."""
        now = time.monotonic()
        with self._lock:
            if self._failure is None and now - self._ok_at < self._fresh_s:
                return None
            if now - self._probed_at < self._probe_every_s:
                return self._failure
            self._probed_at = now
        try:
            reason = self._store.probe_write()
        except TimeoutError:
            return self._failure
        if reason is None:
            self.wrote()
        else:
            self.failed(reason)
        return reason


def _conflicting_ids(cursor, records: Sequence[Any], new: Sequence[Any], sqlite: bool) -> list[str]:
    """The request ids among the duplicates (`records` not in `new`) whose stored row differs.
    Only duplicates are read back, in the batch's transaction (a batch of new records reads nothing).
    A duplicate is compared with the row of its own key (on PostgreSQL request_id and started_at).
    A duplicate from another producer is no conflict: a gateway and the engine behind it each record
    the request they share (under the gateway's id and the engine's instance; the gateway's record is the
    one tagged `gateway`), and the two are merged into one row (collector.ingest.merge)."""
    if len(new) == len(records):
        return []
    stored_new = {id(record) for record in new}
    duplicates = [record for record in records if id(record) not in stored_new]
    stored = _stored_requests(cursor, duplicates, sqlite)
    key, positions = REQUESTS.columns.index("request_id"), _key_positions(sqlite)
    conflicting = []
    for values in REQUESTS.rows(duplicates, _identity):
        row = stored.get(tuple(values[i] for i in positions))
        if row is not None and _producer(row) == _producer(values) and not _same_row(values, row):
            conflicting.append(values[key])
    return conflicting


def _producer(row: Sequence[Any]) -> tuple[Any, Any]:
    """Who recorded a row: its instance and the gateway that proxied it (None: the instance itself)."""
    tags = row[REQUESTS.columns.index("tags")]
    tags = orjson.loads(tags) if isinstance(tags, (str, bytes)) else tags
    return row[REQUESTS.columns.index("instance")], (tags or {}).get(GATEWAY_TAG)


def _key_positions(sqlite: bool) -> list[int]:
    """Where the requests' unique key columns sit in a row of REQUESTS.columns."""
    return [REQUESTS.columns.index(name) for name in (REQUESTS if sqlite else PG_REQUESTS).conflict]


def _stored_requests(cursor, records: Sequence[Any], sqlite: bool, chunk: int = 500) -> dict[tuple, Sequence[Any]]:
    """The stored rows of these records' request ids, by unique key."""
    columns, positions = ", ".join(REQUESTS.columns), _key_positions(sqlite)
    request_ids = [record.request_id for record in records]
    rows = {}
    for start in range(0, len(request_ids), chunk):
        ids = request_ids[start : start + chunk]
        where = f"IN ({', '.join('?' * len(ids))})" if sqlite else "= ANY(%s)"
        cursor.execute(f"SELECT {columns} FROM requests WHERE request_id {where}", ids if sqlite else (ids,))
        rows.update((tuple(row[i] for i in positions), row) for row in cursor.fetchall())
    return rows


def _same_row(values: Sequence[Any], row: Sequence[Any]) -> bool:
    """Equal column by column; JSON columns compared decoded (SQLite returns their text)."""
    for i in REQUESTS.json_positions:
        if isinstance(row[i], (str, bytes)):
            row = [*row[:i], orjson.loads(row[i]), *row[i + 1 :]]
    return list(values) == list(row)


def _sqlite_executemany(cursor, spec: _TableSpec, records: Sequence[Any]) -> list[Any]:
    """Insert, skipping stored keys; returns the records that were new."""
    if not records:
        return []
    name = spec.table.name
    last_id = cursor.execute(f"SELECT max(id) FROM {name}").fetchone()[0] or 0
    marks = ", ".join("?" * len(spec.columns))
    cursor.executemany(
        f"INSERT OR IGNORE INTO {name} ({', '.join(spec.columns)}) VALUES ({marks})", spec.rows(records, _json_text)
    )
    if cursor.rowcount == len(records):
        return list(records)
    # Some were skipped: the rows with ids past `last_id` are this batch's new ones (the
    # transaction began IMMEDIATE, holding SQLite's write lock, so nobody else's ids interleave).
    new_keys = {
        tuple(row) for row in cursor.execute(f"SELECT {', '.join(spec.conflict)} FROM {name} WHERE id > ?", (last_id,))
    }
    return _first_of_each(spec, records, new_keys)


def _first_of_each(spec: _TableSpec, records: Sequence[Any], new_keys: set[tuple]) -> list[Any]:
    """The records whose key is in `new_keys`, first occurrence only (later ones were duplicates)."""
    single = len(spec.conflict) == 1
    new = []
    for record in records:
        key = spec.key(record)
        key = (key,) if single else key
        if key in new_keys:
            new_keys.discard(key)
            new.append(record)
    return new


def _postgres_copy(cursor, spec: _TableSpec, records: Sequence[Any]) -> list[Any]:
    """COPY into a staging table, then insert what is not stored yet; returns the new records."""
    if not records:
        return []
    name, cols = spec.table.name, ", ".join(spec.columns)
    staging = f"_staging_{name}"
    cursor.execute(
        f"CREATE TEMP TABLE IF NOT EXISTS {staging} ON COMMIT DELETE ROWS AS SELECT {cols} FROM {name} WITH NO DATA"
    )
    with cursor.copy(f"COPY {staging} ({cols}) FROM STDIN (FORMAT BINARY)") as copy:
        copy.set_types(spec.pg_types)
        for row in spec.rows(records, _identity):
            copy.write_row(row)
    key = ", ".join(spec.conflict)
    cursor.execute(
        f"INSERT INTO {name} ({cols}) SELECT {cols} FROM {staging} ON CONFLICT ({key}) DO NOTHING RETURNING {key}"
    )
    new_keys = {tuple(row) for row in cursor.fetchall()}
    cursor.execute(f"TRUNCATE {staging}")
    return list(records) if len(new_keys) == len(records) else _first_of_each(spec, records, new_keys)
