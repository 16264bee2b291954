"""TelemetryClient against a real collector: batching, spooling while it is down, ordered replay."""

from __future__ import annotations

import time

import pytest
from collector_live import running_collector
from collector_payloads import event_dict, request_dict, sample_dict
from sqlalchemy import create_engine, text
from waiting import wait_for

from specwatch.collector.settings import Settings
from specwatch.common.procs import free_port
from specwatch.telemetry.client import TelemetryClient
from specwatch.telemetry.schema import DeviceSample, EngineEvent, RequestRecord


def records(start: int, n: int) -> list[RequestRecord]:
    return [RequestRecord.model_validate(request_dict(i)) for i in range(start, start + n)]


def stored_ids(settings) -> list[str]:
    db = create_engine(settings.database_url_resolved)
    with db.connect() as conn:
        ids = list(conn.scalars(text("SELECT request_id FROM requests ORDER BY id")))
    db.dispose()
    return ids


def drain(client: TelemetryClient, timeout: float = 20.0) -> None:
    wait_for(
        lambda: client.flush(5.0) and client.stats().spool_bytes == 0,
        lambda: f"the spool to drain: {client.stats()}",
        timeout=timeout,
        interval=0.05,
    )


def test_delivers_every_kind_in_batches(settings):
    port = free_port()
    with (
        running_collector(settings, port) as url,
        TelemetryClient(url, batch_size=500, flush_interval_s=0.05) as client,
    ):
        for record in records(0, 1200):
            client.submit_request(record)
        client.submit_sample(DeviceSample.model_validate(sample_dict(1)))
        client.submit_event(EngineEvent.model_validate(event_dict(1)))
        assert client.flush(10.0)
        stats = client.stats()
    assert (stats.submitted, stats.delivered, stats.spooled, stats.rejected) == (1202, 1202, 0, 0)
    assert len(stored_ids(settings)) == 1200


def test_spools_while_down_then_replays_in_order(settings, tmp_path):
    port = free_port()  # nothing listens there yet
    client = TelemetryClient(
        f"http://127.0.0.1:{port}", tmp_path / "spool", batch_size=100, flush_interval_s=0.02, retries=1
    )
    started = time.perf_counter()
    for wave in range(3):
        for record in records(wave * 100, 100):
            client.submit_request(record)
    assert time.perf_counter() - started < 0.5  # the producer never waits for the collector
    assert client.flush(10.0)
    assert client.stats().spooled == 300 and client.stats().spool_bytes > 0
    with running_collector(settings, port):
        for record in records(300, 50):  # newer records must queue behind the spooled ones
            client.submit_request(record)
        drain(client)
        client.close()
    assert stored_ids(settings) == [f"req-{i}" for i in range(350)]


def test_spool_outlives_the_client_process(settings, tmp_path):
    port = free_port()
    first = TelemetryClient(
        f"http://127.0.0.1:{port}", tmp_path / "spool", batch_size=50, flush_interval_s=0.02, retries=0
    )
    for record in records(0, 120):
        first.submit_request(record)
    first.close()
    assert first.stats().spool_bytes > 0
    with running_collector(settings, port) as url:
        second = TelemetryClient(url, tmp_path / "spool", flush_interval_s=0.02)
        assert second.stats().spool_bytes == first.stats().spool_bytes
        drain(second)
        second.close()
    assert stored_ids(settings) == [f"req-{i}" for i in range(120)]


def test_spool_is_bounded_and_overflow_is_counted(tmp_path):
    client = TelemetryClient(
        f"http://127.0.0.1:{free_port()}",
        tmp_path / "spool",
        batch_size=100,
        flush_interval_s=0.02,
        retries=0,
        max_spool_bytes=200_000,
    )
    for record in records(0, 1000):
        client.submit_request(record)
    client.flush(10.0)
    stats = client.stats()
    client.close()
    assert 100_000 < stats.spool_bytes <= 200_000
    assert stats.spooled + stats.dropped_spool_full == 1000 and stats.dropped_spool_full > 0


def test_bounded_queue_drops_instead_of_blocking(tmp_path):
    client = TelemetryClient(
        f"http://127.0.0.1:{free_port()}", None, batch_size=10_000, flush_interval_s=60, max_queue=100
    )
    batch = list(records(0, 300))
    started = time.perf_counter()
    for record in batch:
        client.submit_request(record)
    assert time.perf_counter() - started < 5.0  # a blocking put would wait for the (unreachable) collector
    assert client.stats().dropped_queue_full >= 200
    client.close(timeout=1.0)


def token_settings(db_url: str, tmp_path, token: str) -> Settings:
    return Settings(data_dir=tmp_path, database_url=db_url, ingest_token=token, retention_days=36500)


def stored_once(settings, n: int) -> None:
    """Every one of req-0 .. req-(n-1) is in the database exactly once (0 lost, 0 duplicated)."""
    ids = stored_ids(settings)
    assert len(ids) == n and set(ids) == {f"req-{i}" for i in range(n)}


def auth_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if "ingest token" in r.getMessage()]


def test_a_wrong_token_spools_everything_then_delivers_once_fixed(db_url, tmp_path, caplog):
    settings, port = token_settings(db_url, tmp_path, "right"), free_port()
    with running_collector(settings, port) as url:
        client = TelemetryClient(url, tmp_path / "spool", token="wrong", batch_size=20, flush_interval_s=0.02)
        for wave in range(5):  # several batches, each refused
            for record in records(wave * 20, 20):
                client.submit_request(record)
            assert client.flush(5.0)
        client.submit_request({"not": "a record"})  # type: ignore[arg-type]
        assert client.flush(5.0)
        client.close()
    stats = client.stats()
    assert (stats.delivered, stats.spooled, stats.dropped_spool_full, stats.rejected) == (0, 100, 0, 1)
    assert stats.auth_failing and stats.last_status == 401 and stats.auth_failures >= 5
    assert stored_ids(settings) == []
    (line,) = auth_lines(caplog)  # one loud line, not one per batch
    assert "401" in line and "wrong" in line and "--collector-token" in line and "SPECWATCH_INGEST_TOKEN" in line
    with running_collector(settings, port) as url:  # the producer restarts with the right token
        fixed = TelemetryClient(url, tmp_path / "spool", token="right", flush_interval_s=0.02)
        drain(fixed)
        fixed.close()
    assert not fixed.stats().auth_failing and fixed.stats().delivered == 100
    stored_once(settings, 100)


def test_a_missing_token_spools_until_the_collector_takes_it(db_url, tmp_path, caplog):
    port = free_port()
    client = TelemetryClient(f"http://127.0.0.1:{port}", tmp_path / "spool", batch_size=25, flush_interval_s=0.02)
    with running_collector(token_settings(db_url, tmp_path, "s3cret"), port):
        for record in records(0, 100):
            client.submit_request(record)
        assert client.flush(5.0)
        assert client.stats().spooled == 100 and client.stats().auth_failing
    (line,) = auth_lines(caplog)
    assert "missing" in line
    with running_collector(Settings(data_dir=tmp_path, database_url=db_url, retention_days=36500), port) as url:
        assert url == client.url.removesuffix("/v1/ingest")
        drain(client)  # the same client, the collector restarted without a token requirement
        client.close()
    assert client.stats().delivered == 100 and client.stats().last_status == 200
    stored_once(token_settings(db_url, tmp_path, "s3cret"), 100)


def test_collector_errors_spool_and_replay(settings, tmp_path):
    """A 503 (the database cannot take the batch) keeps the batch; it is delivered once the store is back."""
    with running_collector(settings, free_port()) as url:
        store = create_engine(settings.database_url_resolved)
        client = TelemetryClient(url, tmp_path / "spool", batch_size=30, flush_interval_s=0.02, retries=1)
        with store.begin() as conn:
            conn.execute(text("ALTER TABLE requests RENAME TO requests_away"))
        for record in records(0, 90):
            client.submit_request(record)
        assert client.flush(10.0)
        assert (client.stats().spooled, client.stats().last_status, client.stats().delivered) == (90, 503, 0)
        with store.begin() as conn:
            conn.execute(text("ALTER TABLE requests_away RENAME TO requests"))
        store.dispose()
        drain(client)
        client.close()
    assert client.stats().rejected == 0
    stored_once(settings, 90)


def test_an_invalid_record_drops_only_itself(settings, caplog):
    """A record the collector's validation refuses (e.g. from a newer schema) is dropped, logged; the rest stored."""
    bad = RequestRecord.model_construct(**{**records(7, 1)[0].__dict__, "gamma": -3})
    with running_collector(settings, free_port()) as url:
        client = TelemetryClient(url, batch_size=50, flush_interval_s=0.02)
        for record in records(0, 7) + [bad] + records(8, 42):
            client.submit_request(record)
        assert client.flush(10.0)
        client.close()
    stats = client.stats()
    assert (stats.delivered, stats.rejected, stats.spooled) == (49, 1, 0)
    assert sorted(stored_ids(settings)) == sorted(f"req-{i}" for i in range(50) if i != 7)
    (line,) = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert "1 of 50 records (invalid_batch)" in line and "requests[7]" in line and "gamma" in line


def test_a_token_that_cannot_be_sent_is_a_value_error():
    with pytest.raises(ValueError, match="printable ASCII"):
        TelemetryClient("http://127.0.0.1:9", token="caf\u00e9 au lait")


def test_batches_over_the_body_limit_are_split(settings):
    with running_collector(settings, free_port()) as url:  # the fixture's limit: 256 KiB
        client = TelemetryClient(url, batch_size=2000, flush_interval_s=0.05)
        for record in records(0, 1500):  # ~750 KB in one batch
            client.submit_request(record)
        assert client.flush(20.0)
        client.close()
    assert client.stats().delivered == 1500 and client.stats().rejected == 0
    assert len(stored_ids(settings)) == 1500


def test_misconfiguration_never_reaches_the_producer(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    client = TelemetryClient("not a url at all", spool_dir=blocker / "spool", retries=0, flush_interval_s=0.02)
    for record in records(0, 5):
        client.submit_request(record)
    assert client.flush(5.0)
    client.close()
    stats = client.stats()
    assert stats.submitted == 5 and stats.delivered == 0 and stats.dropped_spool_full == 5  # no usable spool


def test_many_producer_threads(settings):
    import threading

    with running_collector(settings, free_port()) as url:
        client = TelemetryClient(url, batch_size=500, flush_interval_s=0.02)
        chunks = [records(k * 500, 500) for k in range(4)]
        threads = [threading.Thread(target=lambda c=c: [client.submit_request(r) for r in c]) for c in chunks]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert client.flush(20.0)
        client.close()
    assert (client.stats().submitted, client.stats().delivered) == (2000, 2000)
    assert sorted(stored_ids(settings)) == sorted(f"req-{i}" for i in range(2000))
