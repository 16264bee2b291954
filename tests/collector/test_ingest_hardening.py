"""POST /v1/ingest against hostile or broken clients (JSON only, gzip within the body limit, a body
timeout, clients that leave mid-body), conflicting resends, and /readyz while the store cannot write."""

from __future__ import annotations

import contextlib
import gzip
import socket
import subprocess
import time
import zlib
from pathlib import Path

import orjson
import pytest
from collector_live import running_collector
from collector_payloads import request_dict
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry
from sqlalchemy import create_engine, func, select, text
from sqlalchemy.engine import make_url
from test_metrics import scrape, total
from waiting import wait_for

from specwatch.collector.models import Request
from specwatch.collector.settings import Settings
from specwatch.common.procs import free_port, start_collector
from specwatch.service.app import create_app

JSON = {"content-type": "application/json"}


def stored(client) -> int:
    with client.app.state.store.db.connect() as conn:
        return conn.scalar(select(func.count()).select_from(Request))


def batch(*ids: int, **changes) -> bytes:
    return orjson.dumps({"requests": [request_dict(i, **changes) for i in ids]})


@pytest.mark.parametrize(
    "content_type",
    [
        None,
        "text/plain",
        "text/plain;charset=UTF-8",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/json; charset=latin-1",
        "application/jsonx",
    ],
)
def test_only_json_bodies_are_accepted(client, content_type):
    """Bodies a web page can POST cross-site without a CORS preflight are refused with 415."""
    headers = {"content-type": content_type} if content_type else {}
    response = client.post("/v1/ingest", content=batch(1), headers=headers)
    assert response.status_code == 415, response.text
    assert response.json()["detail"]["error"] == "unsupported_media_type" and stored(client) == 0
    assert total(scrape(client), "specwatch_ingest_rejected_batches_total", reason="unsupported_media_type") == 1


def test_form_post_is_refused(client):
    response = client.post("/v1/ingest", data={"requests": orjson.dumps([request_dict(1)]).decode()})
    assert response.status_code == 415 and stored(client) == 0


@pytest.mark.parametrize(
    "content_type", ["application/json", "Application/JSON; charset=UTF-8", 'application/json;charset="utf-8"']
)
def test_json_with_utf8_charset_is_accepted(client, content_type):
    assert client.post("/v1/ingest", content=batch(1), headers={"content-type": content_type}).status_code == 200


def test_gzip_body_is_stored(client):
    body = gzip.compress(batch(1, 2)) + gzip.compress(batch(3)[:0])  # a second, empty member is allowed
    response = client.post("/v1/ingest", content=body, headers={**JSON, "content-encoding": "gzip"})
    assert response.status_code == 200, response.text
    assert response.json()["accepted"] == 2 and stored(client) == 2


@pytest.mark.parametrize(
    ("encoding", "body", "status"),
    [("br", b"x", 415), ("deflate", zlib.compress(b"{}"), 415), ("gzip", b"not gzip", 400), ("gzip", b"\x1f\x8b", 400)],
)
def test_other_encodings_and_broken_gzip_are_refused(client, encoding, body, status):
    response = client.post("/v1/ingest", content=body, headers={**JSON, "content-encoding": encoding})
    assert response.status_code == status, response.text


def test_gzip_bomb_is_413_and_stores_nothing(client):
    """20 MB of JSON whitespace compresses to ~20 KB, under the fixture's 256 KiB body limit."""
    inflated = b'{"requests": [' + orjson.dumps(request_dict(1)) + b"," + b" " * 20_000_000 + b"]}"
    bomb = gzip.compress(inflated, compresslevel=9)
    assert len(bomb) < client.app.state.settings.max_body_bytes
    response = client.post("/v1/ingest", content=bomb, headers={**JSON, "content-encoding": "gzip"})
    assert response.status_code == 413 and response.json()["detail"]["decompressed"] is True
    assert stored(client) == 0


def conflicts_are_reported_and_counted(client) -> None:
    assert client.post("/v1/ingest", content=batch(1, 2, 3), headers=JSON).status_code == 200
    changed = orjson.dumps(
        {
            "requests": [
                request_dict(1),  # identical: a plain duplicate
                request_dict(2, e2e_s=9.5),  # same id, other payload: a conflict
                request_dict(3, tags={"tenant": "other"}),  # differs in a JSON column
                request_dict(4),
                request_dict(4, output_tokens=1),  # an in-batch resend that differs from the first
                request_dict(1, instance="gateway-1", e2e_s=1.2),  # another producer's view: no conflict
            ]
        }
    )
    body = client.post("/v1/ingest", content=changed, headers=JSON).json()
    assert body["requests"] == {"accepted": 1, "duplicates": 5}
    assert body["conflicts"]["count"] == 3 and sorted(body["conflicts"]["request_ids"]) == sorted(
        [request_dict(i)["request_id"] for i in (2, 3, 4)]
    )
    assert client.post("/v1/ingest", content=batch(1, 4), headers=JSON).json()["conflicts"]["count"] == 0
    assert total(scrape(client), "specwatch_ingest_conflicts_total") == 3


def test_conflicting_resends_are_reported_and_counted(client):
    conflicts_are_reported_and_counted(client)


def test_conflicts_in_worker_processes(db_url, tmp_path):
    settings = Settings(data_dir=tmp_path, database_url=db_url, retention_days=36500, ingest_processes=2)
    with TestClient(create_app(settings, CollectorRegistry())) as client:
        conflicts_are_reported_and_counted(client)


def test_many_conflicts_report_the_first_ten_ids(client):
    client.post("/v1/ingest", content=batch(*range(30)), headers=JSON)
    body = client.post("/v1/ingest", content=batch(*range(30), e2e_s=7.0), headers=JSON).json()
    assert body["conflicts"]["count"] == 30 and len(body["conflicts"]["request_ids"]) == 10


# --- a real server: stalled and abandoned bodies -------------------------------------------------


def partial_post(port: int, declared: int, sent: bytes) -> socket.socket:
    """A POST /v1/ingest declaring `declared` body bytes and sending only `sent`."""
    conn = socket.create_connection(("127.0.0.1", port), timeout=10)
    head = (
        f"POST /v1/ingest HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {declared}\r\n\r\n"
    )
    conn.sendall(head.encode() + sent)
    return conn


def read_all(conn: socket.socket) -> bytes:
    chunks = []
    while chunk := conn.recv(65536):
        chunks.append(chunk)
    return b"".join(chunks)


def test_a_stalled_body_gets_408_and_the_connection_closed(tmp_path):
    settings = Settings(data_dir=tmp_path, retention_days=36500, ingest_processes=0, body_timeout_s=1.0)
    port = free_port()
    with running_collector(settings, port):
        conn = partial_post(port, 10_000, batch(1)[:50])
        started = time.monotonic()
        answer = read_all(conn)  # returns once the server closed the connection
        elapsed = time.monotonic() - started
        conn.close()
    assert answer.startswith(b"HTTP/1.1 408"), answer
    assert b"body_timeout" in answer and 0.9 < elapsed < 4, elapsed


def test_a_client_leaving_mid_body_is_one_log_line_not_a_traceback(tmp_path):
    port, log = free_port(), tmp_path / "collector.log"
    collector = start_collector(port, log, f"sqlite:///{tmp_path / 'c.db'}", env={"SPECWATCH_INGEST_PROCESSES": "0"})
    try:
        for _ in range(3):
            partial_post(port, 10_000, batch(1)[:50]).close()
        wait_for(lambda: log.read_text().count("disconnected before sending the whole body") == 3, "the log lines")
        time.sleep(0.5)  # anything logged after the line
    finally:
        collector.terminate()
        collector.wait(30)
    text_ = log.read_text()
    assert "Traceback" not in text_ and "Exception in ASGI application" not in text_, text_


# --- /readyz while the store cannot write --------------------------------------------------------


@contextlib.contextmanager
def read_only_sqlite(url: str):
    """The database files made immutable (`chattr +i`): unlike chmod, that stops root too, and the
    connections the service already holds (chmod only affects files opened later)."""
    db = Path(make_url(url).database)
    files = [db, db.with_name(db.name + "-wal")]
    try:
        subprocess.run(["chattr", "+i", *map(str, files)], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot make the database files immutable here (needs root and chattr): {exc}")
    try:
        yield
    finally:
        subprocess.run(["chattr", "-i", *map(str, files)], check=True)


@contextlib.contextmanager
def read_only_postgres(url: str):
    """PostgreSQL refusing writes (`default_transaction_read_only`, as on a standby): the collector's
    sessions are ended, so it reconnects into read-only ones; and again on the way back."""
    admin = create_engine(url, isolation_level="AUTOCOMMIT")

    def switch(action: str) -> None:
        with admin.connect() as conn:
            conn.execute(text(f'ALTER DATABASE "{make_url(url).database}" {action}'))
            others = "datname = current_database() AND pid <> pg_backend_pid()"
            conn.execute(text(f"SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE {others}"))

    switch("SET default_transaction_read_only = on")
    try:
        yield
    finally:
        switch("RESET default_transaction_read_only")
        admin.dispose()


def test_readyz_is_503_while_the_store_cannot_write(db_url, tmp_path):
    read_only = read_only_sqlite if db_url.startswith("sqlite") else read_only_postgres
    settings = Settings(data_dir=tmp_path, database_url=db_url, retention_days=36500, ingest_processes=2)
    with TestClient(create_app(settings, CollectorRegistry())) as client:
        assert client.get("/readyz").status_code == 200
        with read_only(db_url):
            refused = client.post("/v1/ingest", content=batch(1), headers=JSON)
            assert refused.status_code == 503, refused.text
            ready = client.get("/readyz")
            assert ready.status_code == 503 and "cannot write" in ready.json()["reason"], ready.text
            assert client.get("/readyz").status_code == 503  # probed at most once a second: the same answer
        wait_for(lambda: client.get("/readyz").status_code == 200, "readyz to recover", timeout=10)
        assert client.post("/v1/ingest", content=batch(1), headers=JSON).status_code == 200
