"""raw tables partitioned by day on PostgreSQL

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-02

On PostgreSQL `requests`, `device_samples`, `engine_events` and `vllm_scrapes` become RANGE
partitioned on their time column (epoch seconds), one partition per UTC day plus a DEFAULT
partition for rows outside the created days (`collector.partitions` says why and how the leader
keeps them). An existing table is converted in place, per table in this migration's transaction:
rename it, create the partitioned parent with the same columns and defaults (its id sequence moves
over, so new ids continue after the old ones and the roll-up watermark stays valid), create a
partition for every day that has rows plus today and the next `AHEAD_DAYS`, copy the rows
(INSERT ... SELECT), drop the old table, then build the keys and indexes on the parent (after the
copy: building an index once is cheaper than maintaining it row by row). Unique keys gain the
partition key (PostgreSQL's rule): requests (request_id, started_at), primary keys (id, <time>).

The copy rewrites every raw row once, under an exclusive lock: on a large store expect it to take
about as long as loading the rows did (budget downtime, or shorten retention first). SQLite: no-op.

Downgrade converts back to plain tables with the keys of 0001/0003 (it fails if two requests share
a request_id with different started_at, which only the partitioned table can hold).
"""

from __future__ import annotations

import time

import sqlalchemy as sa
from alembic import op

from specwatch.collector.tiers import partitions

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

# table -> (partition column, unique keys, plain indexes) as this revision leaves them on PostgreSQL
LAYOUT = {
    "requests": (
        "started_at",
        {"uq_requests_request_id_started_at": ("request_id", "started_at")},
        {"ix_requests_started_at": ("started_at",), "ix_requests_instance_started_at": ("instance", "started_at")},
    ),
    "device_samples": (
        "at",
        {"uq_device_samples_instance_device_at": ("instance", "device", "at")},
        {"ix_device_samples_at": ("at",)},
    ),
    "engine_events": (
        "at",
        {"uq_engine_events_instance_kind_at": ("instance", "kind", "at")},
        {"ix_engine_events_at": ("at",)},
    ),
    "vllm_scrapes": ("at", {}, {"ix_vllm_scrapes_at": ("at",)}),
}
# the unique keys before this revision (downgrade restores them)
PLAIN_UNIQUE = {
    "requests": {"uq_requests_request_id": ("request_id",)},
    "device_samples": {"uq_device_samples_instance_device_at": ("instance", "device", "at")},
    "engine_events": {"uq_engine_events_instance_kind_at": ("instance", "kind", "at")},
    "vllm_scrapes": {},
}


def upgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "postgresql":
        return
    now = time.time()
    for table, (column, _, _) in LAYOUT.items():
        old = _set_aside(conn, table)
        conn.execute(sa.text(f"CREATE TABLE {table} (LIKE {old} INCLUDING DEFAULTS) PARTITION BY RANGE ({column})"))
        _create_partitions(conn, table, old, column, now)
        _move_rows(conn, old, table)
        _add_keys(conn, table, ("id", column), LAYOUT[table][1], LAYOUT[table][2])


def downgrade() -> None:
    conn = op.get_bind()
    if conn.dialect.name != "postgresql":
        return
    for table, (_, _, indexes) in LAYOUT.items():
        old = _set_aside(conn, table)
        conn.execute(sa.text(f"CREATE TABLE {table} (LIKE {old} INCLUDING DEFAULTS)"))
        _move_rows(conn, old, table)
        _add_keys(conn, table, ("id",), PLAIN_UNIQUE[table], indexes)


def _set_aside(conn: sa.Connection, table: str) -> str:
    """Rename `table` to <table>_old; its keys and indexes go when it is dropped (freeing their names)."""
    old = f"{table}_old"
    conn.execute(sa.text(f"ALTER TABLE {table} RENAME TO {old}"))
    return old


def _create_partitions(conn: sa.Connection, table: str, old: str, column: str, now: float) -> None:
    partitions.create_default(conn, table)
    days = conn.scalars(
        sa.text(f"SELECT DISTINCT floor({column} / {partitions.DAY_S})::bigint * {partitions.DAY_S} FROM {old}")
    ).all()
    first = partitions.day_start(now)
    ahead = range(first, first + (partitions.AHEAD_DAYS + 1) * partitions.DAY_S, partitions.DAY_S)
    spec = partitions.RawTable(table, column)
    for start in sorted(set(days) | set(ahead)):
        partitions.create_day(conn, spec, int(start))


def _move_rows(conn: sa.Connection, old: str, table: str) -> None:
    """Copy every row (same column order: the new table was created LIKE the old one), hand the id
    sequence to the new table, drop the old one."""
    conn.execute(sa.text(f"INSERT INTO {table} SELECT * FROM {old}"))
    sequence = conn.scalar(sa.text("SELECT pg_get_serial_sequence(:old, 'id')"), {"old": old})
    if sequence is not None:
        conn.execute(sa.text(f"ALTER SEQUENCE {sequence} OWNED BY {table}.id"))
    conn.execute(sa.text(f"DROP TABLE {old}"))


def _add_keys(conn: sa.Connection, table: str, primary: tuple, unique: dict, indexes: dict) -> None:
    conn.execute(sa.text(f"ALTER TABLE {table} ADD CONSTRAINT pk_{table} PRIMARY KEY ({', '.join(primary)})"))
    for name, columns in unique.items():
        conn.execute(sa.text(f"ALTER TABLE {table} ADD CONSTRAINT {name} UNIQUE ({', '.join(columns)})"))
    for name, columns in indexes.items():
        conn.execute(sa.text(f"CREATE INDEX {name} ON {table} ({', '.join(columns)})"))
