"""The leader lock is never left held by a connection nobody uses (issue 30: on the suite's one
PostgreSQL database such a connection kept every later replica a follower; in a fleet it would leave
the fleet with no leader until that connection died).

Real connections on a real PostgreSQL; SQLAlchemy's own event hooks hold a connect or a statement
back at the moment the race needs, where under load a busy machine did so by chance.
"""

from __future__ import annotations

import asyncio
import threading

from sqlalchemy import event, text
from test_leader import _lead_until, needs_postgres
from waiting import wait_for

import specwatch.collector.leader as leader_module
from specwatch.collector.db import make_db
from specwatch.collector.leader import Leadership

pytestmark = needs_postgres


async def _forever() -> None:
    await asyncio.Event().wait()


def _advisory_locks(url: str) -> int:
    db = make_db(url)
    try:
        with db.connect() as conn:
            return conn.scalar(text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted"))
    finally:
        db.dispose()


def test_a_lead_cancelled_while_connecting_leaves_no_lock_behind(empty_postgres):
    """`lead` is cancelled while its first try is still connecting: the release must wait for that
    try, not run before it and leave the lock to the connection the try then opens."""
    leadership = Leadership(make_db(empty_postgres), "r0", retry_s=0.05)
    connecting, gate = threading.Event(), threading.Event()
    event.listen(leadership._lock_db, "connect", lambda *_: connecting.set() or gate.wait(30))

    async def scenario() -> None:
        task = asyncio.create_task(leadership.lead(_forever))
        assert await asyncio.to_thread(connecting.wait, 30)
        task.cancel()
        await asyncio.sleep(0.5)  # the release's turn comes while the try is still connecting
        gate.set()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scenario())
    assert _advisory_locks(empty_postgres) == 0
    other = Leadership(make_db(empty_postgres), "r1")
    try:
        assert other._try_acquire()
    finally:
        other.release()


def test_a_hung_check_ends_its_session_and_the_next_replica_leads(empty_postgres, monkeypatch):
    """The leader's check hangs (held back before it reaches the server): it stops its work, ends its
    lock session from a second connection, and the follower takes over while the check still hangs."""
    monkeypatch.setattr(leader_module, "CHECK_TIMEOUT_S", 0.5)
    engines = [make_db(empty_postgres) for _ in range(2)]
    leaders = [Leadership(e, f"r{i}", retry_s=0.1) for i, e in enumerate(engines)]
    hung: dict[str, Leadership] = {}
    gate = threading.Event()
    for leadership in leaders:
        event.listen(leadership._lock_db, "before_cursor_execute", _hold_back(hung, gate, leadership))

    def scenario(history, tasks) -> bool:
        if not hung and history[-1]:
            hung["who"] = leaders[int(history[-1][0][1:])]  # the first leader's next check hangs
        return bool(hung) and bool(history[-1]) and history[-1][0] != hung["who"].replica_id

    try:
        history = asyncio.run(_lead_until(leaders, scenario))
        assert all(len(step) <= 1 for step in history), "two replicas worked at once"
        assert not gate.is_set()  # the takeover did not wait for the hung check
    finally:
        gate.set()
        for db in engines:
            db.dispose()
    wait_for(lambda: _advisory_locks(empty_postgres) == 0, "every lock session to end", timeout=15)


def _hold_back(hung: dict, gate: threading.Event, leadership: Leadership):
    """A `before_cursor_execute` hook: the lock check of the replica in `hung` waits for `gate`."""

    def hook(conn, cursor, statement, *_):
        if hung.get("who") is leadership and "pg_locks" in statement:
            gate.wait(60)

    return hook
