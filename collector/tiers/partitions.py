"""Day partitions of the raw tables on PostgreSQL (SQLite keeps plain tables).

`requests` (by `started_at`), `device_samples`, `engine_events` and `vllm_scrapes` (by `at`) are
declaratively partitioned by RANGE on their time column, epoch seconds, one partition per UTC day
(`<table>_pYYYYMMDD`, bounds at midnights: [day, day + 86400)), plus a DEFAULT partition
(`<table>_default`) for any row outside the created days: a far-past or far-future timestamp is
stored there and never makes an ingest fail. Migration 0010 converts an existing database.

The leader, every maintenance pass (`collector.maintenance.run_once`):
  * creates today's partition and the next `AHEAD_DAYS` days' (`ensure_ahead`). A day whose rows
    already sit in the default partition (a future timestamp, or a leader that was down for days)
    gets its rows moved into the new partition in the same transaction;
  * retention drops the partitions that end at or before the retention cutoff (`drop_before`:
    DETACH + DROP, no row-by-row DELETE), then DELETEs only what remains older than the cutoff,
    which partition pruning confines to the boundary day and the default partition.

PostgreSQL requires every unique key of a partitioned table to include the partition key, so on
PostgreSQL the keys are: `requests` (request_id, started_at) and the primary keys (id, <time>).
Samples' and events' keys already held their time. What that changes for requests: a resent
record is the same record, started_at included (producers serialise it once and the spool replays
those bytes), so a resend is still skipped as a duplicate. Only a record reusing another's
request_id with a different started_at is now stored as a second row where SQLite keeps the first
and counts a conflict. Request ids are UUIDs or gateway-unique, so such a record is a producer bug,
not a resend; enforcing global uniqueness would need a second, unpartitioned key table written on
every insert and deleted row by row at retention, the very cost partitions remove.
"""

from __future__ import annotations

import datetime as dt
import math
import re
from dataclasses import dataclass

from sqlalchemy import Connection, text

from specwatch.collector.models import OTHER_PACKAGES_TABLES

DAY_S = 86400
AHEAD_DAYS = 3
LOCK_TIMEOUT_MS = 5000  # DDL waits at most this for in-flight ingest before giving up until the next pass


@dataclass(frozen=True)
class RawTable:
    name: str
    column: str  # the partition key: epoch seconds


RAW_TABLES = (
    RawTable("requests", "started_at"),
    RawTable("device_samples", "at"),
    RawTable("engine_events", "at"),
    RawTable("vllm_scrapes", "at"),
)
BY_NAME = {table.name: table for table in RAW_TABLES}


@dataclass(frozen=True)
class DayPartition:
    name: str
    start: float
    end: float


def day_start(at: float) -> int:
    """The UTC midnight at or before `at`, in epoch seconds."""
    return math.floor(at / DAY_S) * DAY_S


def partition_name(table: str, start: int) -> str:
    return f"{table}_p{dt.datetime.fromtimestamp(start, dt.UTC):%Y%m%d}"


def default_name(table: str) -> str:
    return f"{table}_default"


_BOUNDS = re.compile(r"FROM \('?([-0-9.e+]+)'?\) TO \('?([-0-9.e+]+)'?\)")


def day_partitions(conn: Connection, table: str) -> list[DayPartition]:
    """The table's range partitions, oldest first (the default partition is not one of them)."""
    rows = conn.execute(
        text(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
            "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = CAST(:table AS regclass)"
        ),
        {"table": table},
    ).all()
    parts = []
    for name, bound in rows:
        if match := _BOUNDS.search(bound):
            parts.append(DayPartition(name, float(match[1]), float(match[2])))
    return sorted(parts, key=lambda part: part.start)


def is_partitioned(conn: Connection, table: str) -> bool:
    return bool(
        conn.scalar(
            text("SELECT count(*) FROM pg_partitioned_table WHERE partrelid = CAST(:table AS regclass)"),
            {"table": table},
        )
    )


def create_default(conn: Connection, table: str) -> None:
    conn.execute(text(f"CREATE TABLE IF NOT EXISTS {default_name(table)} PARTITION OF {table} DEFAULT"))


def create_day(conn: Connection, table: RawTable, start: int) -> str:
    """Create the partition of the day starting at `start`, moving that day's rows out of the
    default partition if it holds any (PostgreSQL refuses a new partition whose range the default
    partition has rows of)."""
    name, end, default = partition_name(table.name, start), start + DAY_S, default_name(table.name)
    in_range = f"{table.column} >= {start} AND {table.column} < {end}"
    if not conn.scalar(text(f"SELECT EXISTS (SELECT 1 FROM {default} WHERE {in_range})")):
        conn.execute(text(f"CREATE TABLE {name} PARTITION OF {table.name} FOR VALUES FROM ({start}) TO ({end})"))
        return name
    conn.execute(text(f"CREATE TABLE {name} (LIKE {table.name} INCLUDING DEFAULTS)"))
    conn.execute(
        text(
            f"WITH moved AS (DELETE FROM {default} WHERE {in_range} RETURNING *) INSERT INTO {name} SELECT * FROM moved"
        )
    )
    conn.execute(text(f"ALTER TABLE {table.name} ATTACH PARTITION {name} FOR VALUES FROM ({start}) TO ({end})"))
    return name


def ensure_ahead(conn: Connection, now: float, days: int = AHEAD_DAYS) -> list[str]:
    """Create the partitions of today and the next `days` days where missing; their names."""
    created = []
    conn.execute(text(f"SET LOCAL lock_timeout = {LOCK_TIMEOUT_MS}"))
    for table in RAW_TABLES:
        have = {part.start for part in day_partitions(conn, table.name)}
        for start in range(day_start(now), day_start(now) + (days + 1) * DAY_S, DAY_S):
            if start not in have:
                created.append(create_day(conn, table, start))
    return created


def drop_before(conn: Connection, table: str, cutoff: float, max_id: int | None = None) -> int:
    """DETACH and DROP the table's day partitions that end at or before `cutoff`; the rows they held.

    `max_id`: drop only partitions whose ids are all at most this (requests: rolled up); a
    partition with a newer row is kept until a later pass."""
    conn.execute(text(f"SET LOCAL lock_timeout = {LOCK_TIMEOUT_MS}"))
    dropped = 0
    for part in day_partitions(conn, table):
        if part.end > cutoff:
            break
        rows, newest = conn.execute(text(f"SELECT count(*), max(id) FROM {part.name}")).one()
        if max_id is not None and newest is not None and newest > max_id:
            continue
        conn.execute(text(f"ALTER TABLE {table} DETACH PARTITION {part.name}"))
        conn.execute(text(f"DROP TABLE {part.name}"))
        dropped += rows
    return dropped


# Alembic autogenerate (collector/migrations/env.py and the schema test): what on PostgreSQL differs
# from the ORM, which describes the SQLite shape: the day and default partitions are not ORM tables,
# and requests' unique key includes started_at.
PG_UNIQUE = {"requests": ("uq_requests_request_id", "uq_requests_request_id_started_at")}
_PARTITION_NAME = re.compile(rf"^({'|'.join(t.name for t in RAW_TABLES)})_(p\d{{8}}|default)$")


def include_name(name: str | None, type_: str, parent_names: dict) -> bool:
    return not (type_ == "table" and name is not None and _PARTITION_NAME.match(name))


def include_own_table(name: str | None, type_: str, parent_names: dict) -> bool:
    """Leave out the tables the migrations create for other packages (they check their own)."""
    return not (type_ == "table" and name in OTHER_PACKAGES_TABLES)


def include_object(obj, name: str | None, type_: str, reflected: bool, compare_to) -> bool:
    if type_ != "unique_constraint":
        return True
    return name not in PG_UNIQUE.get(obj.table.name, ())


def autogenerate_options(dialect: str) -> dict:
    """MigrationContext opts for comparing a database of `dialect` with the ORM."""
    if dialect != "postgresql":
        return {"include_name": include_own_table}
    return {"include_name": lambda *a: include_name(*a) and include_own_table(*a), "include_object": include_object}
