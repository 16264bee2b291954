"""SIGKILL the collector mid-stream: no record the client had handed over is lost or stored twice."""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path

from collector_payloads import request_dict
from processes import children, running
from sqlalchemy import create_engine, text
from waiting import wait_for

from specwatch.common import procs
from specwatch.common.procs import free_port
from specwatch.telemetry.client import TelemetryClient
from specwatch.telemetry.schema import RequestRecord

REPO = Path(__file__).resolve().parents[2]
WAVES, PER_WAVE, KILL_AT, RESTART_AT = 30, 100, 8, 18


def start_collector(db_url: str, port: int, log: Path) -> subprocess.Popen:
    return procs.start_collector(port, log, db_url=db_url, env={"SPECWATCH_RETENTION_DAYS": "36500"})


def submit_wave(client: TelemetryClient, wave: int) -> None:
    for i in range(wave * PER_WAVE, (wave + 1) * PER_WAVE):
        client.submit_request(RequestRecord.model_validate(request_dict(i)))


def kill(proc: subprocess.Popen) -> list[int]:
    """SIGKILL the collector; its ingest worker processes leave with it (none lingers holding the database)."""
    workers = children(proc.pid)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    wait_for(lambda: not any(map(running, workers)), "the killed collector's workers to exit", timeout=30)
    return workers


def test_sigkill_mid_ingest_loses_and_duplicates_nothing(db_url, tmp_path):
    port, log = free_port(), tmp_path / "collector.log"
    proc = start_collector(db_url, port, log)
    client = TelemetryClient(
        f"http://127.0.0.1:{port}", tmp_path / "spool", batch_size=150, flush_interval_s=0.02, retries=1, timeout_s=2.0
    )
    delivered_before_kill, workers = 0, []
    try:
        for wave in range(WAVES):
            if wave == KILL_AT:
                # A loaded machine may not have delivered anything yet: wait for the first delivery,
                # then hand over one more wave so the kill lands while batches are in flight.
                wait_for(lambda: client.stats().delivered > 0, "a first delivery", timeout=30, interval=0.01)
                delivered_before_kill = client.stats().delivered
                submit_wave(client, wave)
                workers = kill(proc)
            else:
                submit_wave(client, wave)
            if wave == RESTART_AT:
                proc = start_collector(db_url, port, log)
            time.sleep(0.03)
        wait_for(
            lambda: client.flush(5.0) and client.stats().spool_bytes == 0,
            lambda: f"the spool to drain: {client.stats()}",
            timeout=60,
            interval=0,  # flush() itself waits
        )
        stats = client.stats()
        client.close()
    finally:
        proc.kill()
        proc.wait()
    assert delivered_before_kill > 0 and stats.spooled > 0  # both paths were exercised
    assert len(workers) >= 2  # the ingest worker processes (and multiprocessing's resource tracker)
    assert stats.dropped_queue_full == stats.dropped_spool_full == stats.rejected == 0
    db = create_engine(db_url)
    with db.connect() as conn:
        rows = conn.execute(text("SELECT request_id, count(*) FROM requests GROUP BY request_id")).all()
    db.dispose()
    assert {request_id for request_id, _ in rows} == {f"req-{i}" for i in range(WAVES * PER_WAVE)}
    assert all(n == 1 for _, n in rows)
