"""Database engines and migrations.

SQLite runs in WAL mode with `synchronous=FULL`, so a batch the service acknowledged
survives a SIGKILL (and a power cut); PostgreSQL is used as configured by its URL.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.engine import make_url

# How long a SQLite writer waits for the database lock: 30 s for the background work (roll-ups,
# retention); ingest waits INGEST_BUSY_S, under the producer client's 5 s timeout, so the client gets
# its 503 (and retries) before it gives up on a request the collector is still holding.
BUSY_TIMEOUT_MS = 30_000
INGEST_BUSY_S = 3.0
MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
# pg_advisory_xact_lock key of schema migrations (any fixed bigint; "specwatch migrations" in ASCII, truncated)
MIGRATION_LOCK_KEY = 0x7370_6563_6D69_6772


def make_db(url: str) -> Engine:
    """An Engine for `url`; SQLite files get their directory created and WAL pragmas set."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite":
        return create_engine(url, pool_pre_ping=True)
    if parsed.database and parsed.database != ":memory:":
        Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
    db = create_engine(url, connect_args={"check_same_thread": False, "timeout": BUSY_TIMEOUT_MS / 1000})
    _configure_sqlite(db)
    return db


def _configure_sqlite(db: Engine) -> None:
    # pysqlite's implicit transactions are off; we emit BEGIN ourselves (SQLAlchemy's recipe).
    @event.listens_for(db, "connect")
    def _on_connect(dbapi_connection, _record) -> None:
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        for pragma in ("journal_mode=WAL", "synchronous=FULL", f"busy_timeout={BUSY_TIMEOUT_MS}", "foreign_keys=ON"):
            cursor.execute(f"PRAGMA {pragma}")
        cursor.close()

    @event.listens_for(db, "begin")
    def _on_begin(conn) -> None:
        options = conn.get_execution_options()
        if options.get("sqlite_immediate"):  # a writer: its lock wait set per transaction (pooled connections)
            conn.exec_driver_sql(f"PRAGMA busy_timeout = {int(options.get('sqlite_busy_ms', BUSY_TIMEOUT_MS))}")
        conn.exec_driver_sql("BEGIN IMMEDIATE" if options.get("sqlite_immediate") else "BEGIN")


@contextmanager
def write_transaction(db: Engine, busy_s: float = BUSY_TIMEOUT_MS / 1000) -> Iterator[Connection]:
    """`db.begin()` for writers. On SQLite it takes the write lock at BEGIN (BEGIN IMMEDIATE):
    a deferred transaction that reads before it writes fails at once with 'database is locked'
    when another writer committed in between, while IMMEDIATE waits its turn, at most `busy_s`."""
    options = {"sqlite_immediate": True, "sqlite_busy_ms": max(1, int(busy_s * 1000))}
    with db.connect().execution_options(**options) as conn, conn.begin():
        yield conn


def alembic_config(url: str | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if url:
        config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(db: Engine, revision: str = "head") -> None:
    """Bring the schema to `revision` (the service calls this on start).

    On PostgreSQL the transaction first takes an advisory lock, so replicas starting together
    against one database migrate one after the other: the first runs the migrations, the others
    then find the schema at head and do nothing (without it, all run CREATE TABLE at once and
    all but one fail). SQLite needs none: its writers are serialised by the database lock."""
    config = alembic_config()
    with db.begin() as connection:
        if connection.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
        config.attributes["connection"] = connection
        command.upgrade(config, revision)


def is_current(db: Engine) -> bool:
    """True when the database is at the newest migration (used by /readyz)."""
    heads = set(ScriptDirectory.from_config(alembic_config()).get_heads())
    with db.connect() as connection:
        return set(MigrationContext.configure(connection).get_current_heads()) == heads
