"""Ingest in worker processes (the service's default): the same answers, rows and metrics as
in threads, and a worker that dies fails only its batch (503, retried) and is replaced."""

from __future__ import annotations

import multiprocessing
import os
import signal
import subprocess

import httpx
import pytest
from collector_payloads import request_dict, sample_dict
from fastapi.testclient import TestClient
from processes import children, running
from prometheus_client import CollectorRegistry
from sqlalchemy import func, select, text
from test_metrics import scrape, total
from waiting import wait_for

from specwatch.collector.models import DeviceSampleRow, Request
from specwatch.collector.settings import Settings
from specwatch.common.procs import child_env, free_port, specwatch_command
from specwatch.service.app import create_app


@pytest.fixture
def client(db_url, tmp_path):
    settings = Settings(data_dir=tmp_path, database_url=db_url, retention_days=36500, ingest_processes=2)
    with TestClient(create_app(settings, CollectorRegistry())) as test_client:
        yield test_client


def stored(client, model=Request) -> int:
    with client.app.state.store.db.connect() as conn:
        return conn.scalar(select(func.count()).select_from(model))


def workers() -> list[multiprocessing.Process]:
    return [p for p in multiprocessing.active_children() if p.pid != os.getpid()]


def test_workers_store_count_and_refuse_like_threads(client):
    assert len(workers()) == 2  # started with the service, not on the first batch
    rows = [request_dict(i, instance=f"gpu-{i % 2}") for i in range(40)]
    first = client.post("/v1/ingest", json={"requests": rows, "samples": [sample_dict(1)]})
    assert first.status_code == 200 and first.json()["accepted"] == 41
    again = client.post("/v1/ingest", json={"requests": rows[30:] + [request_dict(40)]}).json()
    assert again["requests"] == {"accepted": 1, "duplicates": 10}
    bad = client.post("/v1/ingest", json={"requests": [request_dict(41), request_dict(42, num_accepted_tokens=99)]})
    assert bad.status_code == 422  # raised in a worker, answered by the service
    assert {k: bad.json()["detail"]["errors"][0][k] for k in ("item", "field")} == {
        "item": "requests[1]",
        "field": "num_accepted_tokens",
    }
    assert (
        client.post("/v1/ingest", content=b"{broken", headers={"content-type": "application/json"}).status_code == 400
    )
    assert (stored(client), stored(client, DeviceSampleRow)) == (41, 1)
    metrics = scrape(client)  # summed in the workers, merged by the service: new records only
    assert total(metrics, "specwatch_requests_total") == 41
    assert total(metrics, "specwatch_requests_total", instance="gpu-1") == 20
    assert total(metrics, "specwatch_draft_tokens_total") == sum(
        r["num_draft_tokens"] for r in rows + [request_dict(40)]
    )
    assert total(metrics, "specwatch_ingest_records_total", kind="request", outcome="duplicate") == 10
    assert total(metrics, "specwatch_ingest_rejected_batches_total", reason="invalid_batch") == 1


def test_database_trouble_in_a_worker_is_503_so_clients_retry(client):
    db = client.app.state.store.db
    with db.begin() as conn:
        conn.execute(text("ALTER TABLE requests RENAME TO requests_away"))
    try:
        response = client.post("/v1/ingest", json={"requests": [request_dict(1)]})
        assert response.status_code == 503 and response.json()["detail"]["error"] == "store_unavailable"
    finally:
        with db.begin() as conn:
            conn.execute(text("ALTER TABLE requests_away RENAME TO requests"))
    assert client.post("/v1/ingest", json={"requests": [request_dict(1)]}).status_code == 200


def test_killed_workers_fail_the_batch_with_503_and_are_replaced(client):
    killed = workers()
    for process in killed:
        os.kill(process.pid, signal.SIGKILL)
    batch = {"requests": [request_dict(i) for i in range(20)]}
    refused = client.post("/v1/ingest", json=batch)
    assert refused.status_code == 503 and refused.json()["detail"]["error"] == "store_unavailable"
    # The producer retries: a fresh pool takes the batch, stored once.
    wait_for(lambda: client.post("/v1/ingest", json=batch).status_code == 200, "a replaced worker pool", timeout=60)
    assert stored(client) == 20
    assert {p.pid for p in workers()}.isdisjoint(p.pid for p in killed)
    assert total(scrape(client), "specwatch_ingest_rejected_batches_total", reason="store_unavailable") == 1


# Timing-sensitive in the full suite (failed in some full runs on 2026-12-01, passes alone and under
# synthetic load): run with -m slow until its cause is found (see the closing note of that stop).
# Issue 30 found its failure's signature but not its trigger: a lifespan cancelled while "Waiting for
# application shutdown" is what uvicorn's force exit leaves (a SIGINT it sees after an earlier SIGINT or
# SIGTERM, before the lifespan shutdown starts): `killpg(SIGINT)`, 0.12 s, `kill(SIGINT)` reproduces it
# every time. This test sends SIGINT then SIGTERM, which uvicorn takes as one graceful exit (20 of 20
# passed here under two busy loops); what sends a second SIGINT in a full run is still unknown.
@pytest.mark.slow
def test_ctrl_c_stops_the_service_and_its_workers_cleanly(tmp_path):
    """Ctrl-C in a terminal signals the whole process group, workers included; `specwatch up`
    then terminates the service too."""
    port, log = free_port(), tmp_path / "collector.log"
    cmd = specwatch_command("collector", "serve", "--port", str(port), "--db", f"sqlite:///{tmp_path}/c.db")
    with log.open("wb") as out:
        service = subprocess.Popen(cmd, env=child_env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        wait_for(lambda: _answers(f"http://127.0.0.1:{port}/readyz"), "the collector", timeout=60)
        workers = children(service.pid)
        assert httpx.post(f"http://127.0.0.1:{port}/v1/ingest", json={"requests": [request_dict(1)]}).status_code == 200
        os.killpg(service.pid, signal.SIGINT)
        service.terminate()  # as `specwatch up` does on Ctrl-C: SIGINT to the group, then SIGTERM
        service.wait(30)
    finally:
        if service.poll() is None:
            os.killpg(service.pid, signal.SIGKILL)
    wait_for(lambda: not any(map(running, workers)), "the workers to exit", timeout=30)
    text = log.read_text()
    assert "Application shutdown complete" in text
    assert "Traceback" not in text and "leaked" not in text, text


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False
