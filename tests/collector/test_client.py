"""TelemetryClient against a real collector: batching, spooling while it is down, ordered replay."""

from __future__ import annotations

import time

from collector_live import running_collector
from collector_payloads import event_dict, request_dict, sample_dict
from sqlalchemy import create_engine, text
from waiting import wait_for

from collector.client import TelemetryClient
from collector.schema import DeviceSample, EngineEvent, RequestRecord
from specwatch.common import free_port


def records(start: int, n: int) -> list[RequestRecord]:
    return [RequestRecord.model_validate(request_dict(i)) for i in range(start, start + n)]


def stored_ids(settings) -> list[str]:
    engine = create_engine(settings.database_url_resolved)
    with engine.connect() as conn:
        ids = list(conn.scalars(text("SELECT request_id FROM requests ORDER BY id")))
    engine.dispose()
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


def test_refused_batches_are_counted_not_retried(db_url, tmp_path):
    from collector.settings import Settings

    settings = Settings(data_dir=tmp_path, database_url=db_url, ingest_token="right", retention_days=36500)
    with running_collector(settings, free_port()) as url:
        client = TelemetryClient(url, tmp_path / "spool", token="wrong", flush_interval_s=0.02)
        for record in records(0, 10):
            client.submit_request(record)
        client.submit_request({"not": "a record"})  # type: ignore[arg-type]
        assert client.flush(5.0)
        client.close()
    stats = client.stats()
    assert (stats.rejected, stats.delivered, stats.spool_bytes) == (11, 0, 0)


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
