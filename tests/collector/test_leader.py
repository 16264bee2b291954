"""Several collector replicas on one PostgreSQL: migrations, leadership, and the background work
that must stay exactly-once when two replicas run it at the same moment (roll-ups, webhook delivery).

Each concurrency test starts its workers together on a barrier, against a real PostgreSQL
(SPECWATCH_TEST_POSTGRES_URL); without it they are skipped. SQLite is one process: always the leader.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
from collector_payloads import request_dict
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry, Gauge
from sqlalchemy import func, select, text
from waiting import wait_for
from webhook_receiver import Receiver

from specwatch.alerts.evaluator import Alert, State
from specwatch.alerts.notify import deliver_due, enqueue
from specwatch.alerts.rules import parse_config
from specwatch.collector.db import is_current, make_db, upgrade
from specwatch.collector.ingest.store import Store
from specwatch.collector.leader import LeaderMetrics, Leadership
from specwatch.collector.models import RequestRollup, RequestRollupHourly
from specwatch.collector.settings import Settings
from specwatch.collector.tiers.rollups import roll_up
from specwatch.common.procs import free_port
from specwatch.service.app import create_app
from specwatch.telemetry.schema import IngestBatch, RequestRecord

POSTGRES_URL = os.environ.get("SPECWATCH_TEST_POSTGRES_URL")
needs_postgres = pytest.mark.skipif(
    not POSTGRES_URL,
    reason="PostgreSQL server binaries not found: apt-get install postgresql (or set SPECWATCH_TEST_POSTGRES_URL)",
)


def all_at_once(n: int, work) -> list:
    """`work(i)` in n threads released together; their results (an exception in one fails the test)."""
    barrier = threading.Barrier(n)

    def run(i: int):
        barrier.wait(timeout=30)
        return work(i)

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(run, range(n)))


@needs_postgres
def test_replicas_migrating_an_empty_database_together_all_succeed(empty_postgres):
    dbs = [make_db(empty_postgres) for _ in range(3)]
    try:
        all_at_once(3, lambda i: upgrade(dbs[i]))
        assert all(is_current(e) for e in dbs)
        with dbs[0].connect() as conn:
            assert conn.scalar(text("SELECT count(*) FROM alembic_version")) == 1
    finally:
        for db in dbs:
            db.dispose()


@needs_postgres
def test_concurrent_rollup_passes_count_each_request_once(empty_postgres):
    db = make_db(empty_postgres)
    upgrade(db)
    store = Store(db)
    records = [RequestRecord.model_validate(request_dict(i)) for i in range(3000)]
    store.insert(IngestBatch(requests=records))
    dbs = [make_db(empty_postgres) for _ in range(3)]
    try:
        folded = all_at_once(3, lambda i: roll_up(dbs[i], time.time()).rows_folded)
        assert sorted(folded) == [0, 0, 3000]  # one pass folded them all; the others found nothing left
        with db.connect() as conn:
            for table in (RequestRollup, RequestRollupHourly):
                assert conn.scalar(select(func.sum(table.requests))) == 3000
    finally:
        for e in (db, *dbs):
            e.dispose()


def _firing(i: int) -> Alert:
    labels = {"alertname": "Test", "instance": f"gpu-{i}"}
    return Alert("Test", f"fp-{i}", labels, {}, State.FIRING, value=0.1, active_at=1.0, last_seen_at=1.0, fired_at=1.0)


@needs_postgres
def test_two_deliverers_post_each_notification_once(empty_postgres):
    port = free_port()
    config = parse_config(
        {"rules": [], "receivers": [{"name": f"r{k}", "url": f"http://127.0.0.1:{port}/hook"} for k in range(8)]}
    )
    db = make_db(empty_postgres)
    upgrade(db)
    with db.begin() as conn:
        assert enqueue(conn, config, "Test", [_firing(0)], time.time() - 1, "") == 8
    receiver = Receiver(port, delay_s=0.05)
    dbs = [make_db(empty_postgres) for _ in range(2)]
    try:
        with httpx.Client() as http:
            delivered = all_at_once(2, lambda i: deliver_due(dbs[i], config, http))
        assert sum(delivered) == 8 and min(delivered) > 0  # both delivered some, while the other was posting
        keys = [headers["Idempotency-Key"] for headers, _ in receiver.received]
        assert len(keys) == 8 and len(set(keys)) == 8
    finally:
        receiver.close()
        for e in (db, *dbs):
            e.dispose()


async def _lead_until(leaders: list[Leadership], stop_when, timeout_s: float = 20.0) -> list[list[str]]:
    """Run `lead` on every Leadership; log (per step, who works); returns once stop_when(log) is true."""
    working: set[int] = set()
    history: list[list[str]] = []

    def work_of(i: int):
        async def work() -> None:
            working.add(i)
            try:
                await asyncio.Event().wait()
            finally:
                working.discard(i)

        return work

    tasks = {i: asyncio.create_task(lead.lead(work_of(i))) for i, lead in enumerate(leaders)}
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            history.append(sorted(leaders[i].replica_id for i in working))
            if stop_when(history, tasks):
                return history
        raise AssertionError(f"timed out; history ends {history[-5:]}")
    finally:
        for task in tasks.values():
            task.cancel()
        await asyncio.gather(*tasks.values(), return_exceptions=True)


@needs_postgres
def test_one_leader_at_a_time_and_the_next_takes_over(empty_postgres):
    dbs = [make_db(empty_postgres) for _ in range(3)]
    leaders = [Leadership(e, f"r{i}", retry_s=0.1) for i, e in enumerate(dbs)]
    stopped = {"first": None}

    def scenario(history, tasks) -> bool:
        """Once someone leads, stop its `lead` (as a process exiting would); done when another leads."""
        if stopped["first"] is None and history[-1]:
            stopped["first"] = history[-1][0]
            tasks[int(stopped["first"][1:])].cancel()
        return stopped["first"] is not None and history[-1] and history[-1][0] != stopped["first"]

    try:
        history = asyncio.run(_lead_until(leaders, scenario))
        assert all(len(step) <= 1 for step in history), "two replicas worked at once"
        assert sum(lead.is_leader for lead in leaders) == 0  # all stopped
    finally:
        for db in dbs:
            db.dispose()


@needs_postgres
def test_a_leader_that_loses_its_connection_stops_its_work(empty_postgres):
    """The server ends the leader's session (as when its network or host goes): at its next check the
    leader stops its background work, and the other replica takes the lock."""
    dbs = [make_db(empty_postgres) for _ in range(2)]
    leaders = [Leadership(e, f"r{i}", retry_s=0.1) for i, e in enumerate(dbs)]
    killed = {"who": None}

    def scenario(history, tasks) -> bool:
        if killed["who"] is None and history[-1]:
            killed["who"] = history[-1][0]
            lead = leaders[int(killed["who"][1:])]
            pid = lead._conn.connection.dbapi_connection.info.backend_pid
            with dbs[0].connect() as conn:
                conn.execute(text("SELECT pg_terminate_backend(:pid)"), {"pid": pid})
        return killed["who"] is not None and history[-1] and history[-1][0] != killed["who"]

    try:
        history = asyncio.run(_lead_until(leaders, scenario))
        assert all(len(step) <= 1 for step in history)
    finally:
        for db in dbs:
            db.dispose()


def test_sqlite_is_always_the_leader(tmp_path):
    settings = Settings(data_dir=tmp_path, replica_id="laptop", ingest_processes=0, alerts_enabled=False)
    with TestClient(create_app(settings, CollectorRegistry())) as client:
        assert client.get("/readyz").json() == {"status": "ready", "leader": True, "replica": "laptop"}
        assert "specwatch_collector_leader 1.0" in client.get("/metrics").text


@needs_postgres
def test_readyz_and_metrics_say_who_leads(empty_postgres, tmp_path):
    settings = Settings(
        data_dir=tmp_path, database_url=empty_postgres, ingest_processes=0, alerts_enabled=False, leader_retry_s=0.1
    )
    with TestClient(create_app(settings, CollectorRegistry())) as client:
        wait_for(lambda: client.get("/readyz").json()["leader"], "the only replica to lead", timeout=10)
        assert client.get("/readyz").json()["replica"] == settings.replica_name
        assert "specwatch_collector_leader 1.0" in client.get("/metrics").text
        other = Leadership(make_db(empty_postgres), "other", retry_s=0.1)
        try:
            assert other._try_acquire() is False  # the lock is taken
        finally:
            other.release()


def test_store_derived_gauges_only_on_the_leader(tmp_path):
    db = make_db(f"sqlite:///{tmp_path / 'db.sqlite'}")
    registry, leader_only = CollectorRegistry(), CollectorRegistry()
    Gauge("specwatch_store_derived", "a gauge read from the store", registry=leader_only).set(3)
    leadership = Leadership(db, "r0")
    LeaderMetrics(leadership, registry, leader_only)
    leadership.is_leader = False  # as a follower on PostgreSQL

    def exported() -> set[str]:
        return {metric.name for metric in registry.collect()}

    assert exported() == {"specwatch_collector_leader"}
    leadership.is_leader = True
    assert exported() == {"specwatch_collector_leader", "specwatch_store_derived"}
    db.dispose()
