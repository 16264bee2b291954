"""Leadership among collector replicas: exactly one runs the background work.

Several `specwatch collector serve` processes may share one PostgreSQL database. Each of them
ingests and answers queries; the background work (roll-ups and retention, vLLM scrapes, the alert
runner and its webhook delivery, the monthly report) runs on one of them, the leader.

The leader is the replica holding a session-level `pg_try_advisory_lock(LEADER_LOCK_KEY)` on a
connection of its own. An advisory lock rather than a lease row because PostgreSQL itself ends
the term: when the leader dies (SIGKILL, a crashed host whose TCP connection times out) its
session ends and the lock is released at once, with no clock, no renewal writes and no expiry to
tune; a lease row would need both and would hand over only after its expiry. The price: the lock
connection must reach the server directly (not through a transaction-pooling PgBouncer, which
would move the session), and a replica cut off from the database keeps believing it leads until
it next checks. So every `leader_retry_s` a follower tries the lock and the leader checks its
lock connection; a check that fails (or hangs past `CHECK_TIMEOUT_S`) stops its background work,
and the next replica to try takes over. TCP keepalives on the lock connection make the server
notice a vanished leader within about `KEEPALIVE_S`.

A lock connection is never left behind holding the lock, since nobody else could lead while it lives:
one thread of its own runs every step on it (a try, a check, the release), so a release waits for
the step in flight instead of racing it (a try still connecting when `lead` was cancelled used to
take the lock after the release had run, on a connection nobody closed); and a step that hangs
past `CHECK_TIMEOUT_S` has its server session ended from a second connection, once this replica's
background work has stopped (`pg_terminate_backend` of that pid and start time only: never another
session that reused the pid).

On SQLite the database belongs to one process, which is always the leader.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor

from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily, Metric
from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

log = logging.getLogger("specwatch.collector")
# pg_advisory_lock key of the leader ("specwatch leader" in ASCII, truncated to fit a bigint)
LEADER_LOCK_KEY = 0x7370_6563_6C65_6164
CHECK_TIMEOUT_S = 10.0
KEEPALIVE_S = 10
# libpq: probe an idle connection after 5 s, every 2 s, give up after 3 misses; unacknowledged data
# fails the connection after KEEPALIVE_S (so a check cannot hang on a dead network)
_LIBPQ_KEEPALIVES = {
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
    "tcp_user_timeout": KEEPALIVE_S * 1000,
    "connect_timeout": KEEPALIVE_S,
}
_HOLDS_LOCK = text(
    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND granted "
    "AND classid = :high AND objid = :low AND objsubid = 1"
)
_SESSION = text("SELECT pid, backend_start FROM pg_stat_activity WHERE pid = pg_backend_pid()")
_END_SESSION = text(
    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE pid = :pid AND backend_start = :start"
)


def default_replica_id() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


class Leadership:
    """Whether this replica leads, and the loop that starts and stops the background work with it."""

    def __init__(self, db: Engine, replica_id: str, retry_s: float = 5.0) -> None:
        self.replica_id, self.retry_s = replica_id, retry_s
        self.single_process = db.dialect.name != "postgresql"
        self.is_leader = self.single_process
        self._lock_db = None if self.single_process else _lock_db(db)
        # the lock connection's own thread: its steps never overlap, nor wait behind the loop's executor
        self._thread = None if self.single_process else ThreadPoolExecutor(1, thread_name_prefix="leader-lock")
        self._step: Future | None = None  # the last step submitted to that thread
        self._ended: Future | None = None  # the hung step whose session was ended
        self._conn: Connection | None = None
        self._session: tuple | None = None  # (pid, backend_start) of the lock connection's server session

    async def lead(self, work: Callable[[], Awaitable[None]]) -> None:
        """Run `work()` while this replica leads; runs until cancelled (then releases the lock).
        `work` runs until cancelled too; if it ends by itself it is started again next cycle."""
        if self.single_process:
            await work()
            return
        task: asyncio.Task | None = None
        try:
            while True:
                self.is_leader = await self._hold_or_try()
                if self.is_leader and (task is None or task.done()):
                    log.info("replica %s is the leader: starting the background work", self.replica_id)
                    task = asyncio.create_task(work(), name="leader work")
                elif not self.is_leader and task is not None:
                    log.warning("replica %s lost the leadership: stopping the background work", self.replica_id)
                    await _stop(task)
                    task = None
                await self._end_hung_session()  # only once the work stopped: no two leaders working
                await asyncio.sleep(self.retry_s)
        finally:
            self.is_leader = False
            if task is not None:
                await _stop(task)
            await self._close()

    async def _hold_or_try(self) -> bool:
        """The leader checks its lock; a follower tries to take it. False when the check fails or hangs."""
        if self._step is not None and not self._step.done():
            return False  # the last step still hangs
        self._step = self._thread.submit(self._still_held if self.is_leader else self._try_acquire)
        try:  # asyncio.timeout, not wait_for: 3.11's wait_for can swallow a cancel that races the result
            async with asyncio.timeout(CHECK_TIMEOUT_S):
                return await asyncio.wrap_future(self._step)
        except TimeoutError:
            log.warning(
                "replica %s: the leader lock connection did not answer in %g s", self.replica_id, CHECK_TIMEOUT_S
            )
            return False

    async def _end_hung_session(self) -> None:
        """A step hangs on the lock connection, whose session may hold the lock: end that session."""
        hung = self._step
        if hung is not None and not hung.done() and hung is not self._ended:
            self._ended = hung
            await asyncio.to_thread(self._end_session)

    async def _close(self) -> None:
        """The release, on the lock thread after the step in flight; one that hangs has its session ended."""
        released = asyncio.wrap_future(self._thread.submit(self.release))
        try:
            async with asyncio.timeout(CHECK_TIMEOUT_S):
                await asyncio.shield(released)
        except TimeoutError:
            await asyncio.to_thread(self._end_session)
        self._thread.shutdown(wait=False)

    def _try_acquire(self) -> bool:
        try:
            if self._conn is None:
                self._conn = self._lock_db.connect().execution_options(isolation_level="AUTOCOMMIT")
                self._session = tuple(self._conn.execute(_SESSION).one())
            return bool(self._conn.scalar(text("SELECT pg_try_advisory_lock(:key)"), {"key": LEADER_LOCK_KEY}))
        except SQLAlchemyError as exc:
            log.warning("replica %s could not try the leader lock: %s", self.replica_id, exc)
            self._discard()
            return False

    def _still_held(self) -> bool:
        """The lock is the session's: held while the connection lives, so a query on it checks both."""
        high, low = divmod(LEADER_LOCK_KEY, 1 << 32)
        try:
            return self._conn is not None and self._conn.scalar(_HOLDS_LOCK, {"high": high, "low": low}) == 1
        except SQLAlchemyError as exc:
            log.warning("replica %s: the leader lock connection failed: %s", self.replica_id, exc)
            self._discard()
            return False

    def _end_session(self) -> None:
        """End the lock connection's server session (and its locks) from another connection."""
        if (session := self._session) is None:
            return
        log.warning("replica %s: ending the hung leader lock session (pid %s)", self.replica_id, session[0])
        try:
            with self._lock_db.connect() as conn:
                conn.execute(_END_SESSION, {"pid": session[0], "start": session[1]})
        except SQLAlchemyError as exc:  # the server is out of reach: it ends the session itself (keepalives)
            log.warning("replica %s could not end the hung lock session: %s", self.replica_id, exc)

    def _discard(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(SQLAlchemyError):
                self._conn.invalidate()
        self._conn = self._session = None

    def release(self) -> None:
        """Close the lock connection (its session's locks go with it)."""
        if self._conn is not None:
            with contextlib.suppress(SQLAlchemyError):
                self._conn.close()
            self._conn = self._session = None
        if self._lock_db is not None:
            self._lock_db.dispose()


def _lock_db(db: Engine) -> Engine:
    """A pool-less engine for the one long-lived lock connection (not taken from the service's pool)."""
    connect_args = _LIBPQ_KEEPALIVES if db.dialect.driver in ("psycopg", "psycopg2") else {}
    return create_engine(db.url, poolclass=NullPool, connect_args=connect_args)


async def _stop(task: asyncio.Task) -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


class LeaderMetrics:
    """`specwatch_collector_leader` (1 on the leader, else 0), and the store-derived gauges of
    `leader_only`, exported by the leader alone: every replica reads the same store, so a Prometheus
    `sum` over replicas would count them once per replica."""

    def __init__(self, leadership: Leadership, registry: CollectorRegistry, leader_only: CollectorRegistry) -> None:
        self._leadership, self._leader_only = leadership, leader_only
        registry.register(self)

    def describe(self) -> Iterator[Metric]:
        yield self._gauge()

    def collect(self) -> Iterator[Metric]:
        yield self._gauge()
        if self._leadership.is_leader:
            yield from self._leader_only.collect()

    def _gauge(self) -> GaugeMetricFamily:
        doc = "1 on the replica that runs the background work (alerts, roll-ups, scrapes, reports), else 0."
        return GaugeMetricFamily("specwatch_collector_leader", doc, value=float(self._leadership.is_leader))
