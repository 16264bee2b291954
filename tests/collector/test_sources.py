"""Sources with gateways: the upstream events a real `gateway.app.Gateway` emits and request records,
stored through `collector.ingest.store.Store` (SQLite and PostgreSQL), read back by `breakdown.sources` and
GET /v1/sources."""

from __future__ import annotations

import pytest
from collector_payloads import T0, request_dict, sample_dict
from gateway_events import upstream_snapshots

from specwatch.collector.ingest.store import Store
from specwatch.collector.reads.breakdown import Source, sources
from specwatch.collector.reads.queries import Window
from specwatch.telemetry.schema import EngineEvent, IngestBatch

WINDOW = Window(T0 + 100, T0 + 1100)  # 1000 s; the gateway's snapshots are older than its start


def snapshots() -> list[EngineEvent]:
    """Gateway "edge"'s snapshots at T0 + 1 (both upstreams up) and T0 + 5 (vllm-b down), and one
    after the window's end (vllm-b up again)."""
    return upstream_snapshots([T0 + 1, T0 + 5, T0 + 2000])


def store(db, requests=(), samples=(), events=()) -> None:
    batch = {"requests": list(requests), "samples": list(samples), "events": [e.model_dump() for e in events]}
    Store(db).insert(IngestBatch.model_validate(batch))


def requests(instance: str, n: int, first: int, at: float = T0 + 200) -> list[dict]:
    return [request_dict(first + i, instance=instance, started_at=at + i) for i in range(n)]


@pytest.fixture
def stored(db):
    """6 requests through vllm-a (and one before the window), 3 through vllm-b, 2 that no upstream
    took (instance "edge"), 4 from engine gpu-0 with device samples."""
    store(db, events=snapshots()[:1])  # the first snapshot, stored before the others arrive
    store(
        db,
        requests=requests("vllm-a", 6, 0) + requests("vllm-a", 1, 10, at=T0) + requests("vllm-b", 3, 20),
        events=snapshots()[1:],
    )
    store(db, requests=requests("edge", 2, 30) + requests("gpu-0", 4, 40), samples=[sample_dict(50)])
    return db


def by_name(found: list[Source]) -> dict[str, Source]:
    names = [s.name for s in found]
    assert len(names) == len(set(names)), names
    return {s.name: s for s in found}


def test_the_latest_snapshot_before_the_window_end_gives_each_upstreams_health(stored):
    found = by_name(sources(stored, WINDOW))
    a, b = found["vllm-a"], found["vllm-b"]
    assert (a.kind, a.gateway, a.pool, a.drafter, a.healthy, a.reason) == (
        "upstream",
        "edge",
        "spec",
        "ngram",
        True,
        None,
    )
    assert (b.kind, b.gateway, b.pool, b.drafter, b.healthy) == ("upstream", "edge", "plain", None, False)
    assert b.reason == "connect: connection refused"  # T0 + 5 wins over T0 + 1; T0 + 2000 is after the window
    assert a.url == "http://10.0.0.1:8000" and a.reported_at == b.reported_at == T0 + 5
    later = by_name(sources(stored, Window(T0 + 100, T0 + 2100)))
    assert later["vllm-b"].healthy is True and later["vllm-b"].reported_at == T0 + 2000


def test_upstream_requests_are_counted_once_and_not_as_engines(stored):
    found = sources(stored, WINDOW)
    assert [(s.kind, s.name) for s in found] == [
        ("engine", "gpu-0"),
        ("gateway", "edge"),
        ("upstream", "vllm-a"),
        ("upstream", "vllm-b"),
    ]
    rows = by_name(found)
    assert (rows["vllm-a"].records_in_window, rows["vllm-b"].records_in_window) == (6, 3)
    # rates per second of the active span, as the Overview's: from the first start to the last finish
    # (start + e2e; request_dict's e2e is 1 + (i % 7) / 10): vllm-a's 6 requests run T0+200..T0+206.5
    assert rows["vllm-a"].per_s == pytest.approx(6 / 6.5) and rows["vllm-a"].last_seen_at == pytest.approx(T0 + 206.5)
    gateway = rows["edge"]
    assert (gateway.records_in_window, gateway.reported_at) == (11, T0 + 5)
    assert gateway.last_seen_at == pytest.approx(T0 + 202.3)  # its own last request's finish
    assert gateway.per_s == pytest.approx(11 / 6.5)  # its upstreams' and its own requests over their joint span
    assert gateway.healthy is None and gateway.gateway is None  # health is its upstreams'


def test_an_instance_without_upstream_events_stays_an_engine(stored):
    (db,) = [s for s in sources(stored, WINDOW) if s.kind == "engine"]
    # its sample is its latest sign of life; its 4 requests run from T0+200 to T0+204.1 (the last start + e2e)
    assert db == Source("engine", "gpu-0", T0 + 5 * 50, 4, pytest.approx(4 / 4.1))


def test_a_gateway_without_traffic_in_the_window_still_shows_its_upstreams(db):
    store(db, requests=requests("vllm-a", 2, 0, at=T0 + 10), events=snapshots()[:2])
    found = by_name(sources(db, WINDOW))
    assert set(found) == {"edge", "vllm-a", "vllm-b"}
    assert found["vllm-a"].records_in_window == 0 and found["vllm-b"].healthy is False


def test_malformed_upstream_entries_are_skipped(db):
    detail = {"upstreams": [{"name": "ok", "healthy": "yes", "pool": 3}, {"healthy": False}, "x", {"name": ""}]}
    events = [
        EngineEvent(instance="odd", at=T0 + 1, kind="upstream", detail=detail),
        EngineEvent(instance="bare", at=T0 + 1, kind="upstream", detail={"upstreams": "none"}),
    ]
    store(db, events=events)
    found = by_name(sources(db, WINDOW))
    assert [(s.kind, s.name) for s in found.values()] == [("gateway", "bare"), ("gateway", "odd"), ("upstream", "ok")]
    assert (found["ok"].healthy, found["ok"].pool, found["ok"].gateway) == (None, None, "odd")


def test_api_keeps_the_old_keys_and_adds_the_gateway_fields(client, db):
    store(db, requests=requests("vllm-a", 3, 0) + requests("gpu-0", 2, 10), events=snapshots()[:2])
    got = client.get("/v1/sources", params={"start": WINDOW.start, "end": WINDOW.end})
    assert got.status_code == 200
    rows = {row["name"]: row for row in got.json()}
    assert rows["gpu-0"] == {
        "kind": "engine",
        "name": "gpu-0",
        "last_seen_at": pytest.approx(T0 + 202.4),  # its last request's finish
        "records_in_window": 2,
        "per_s": pytest.approx(2 / 2.4),  # per second of its active span (T0+200..T0+202.4: the last finish)
        **dict.fromkeys(("gateway", "url", "pool", "drafter", "healthy", "reason", "reported_at")),
    }
    assert (rows["vllm-b"]["healthy"], rows["vllm-b"]["reason"]) == (False, "connect: connection refused")
    assert (rows["vllm-a"]["kind"], rows["vllm-a"]["records_in_window"]) == ("upstream", 3)


def test_a_lone_engine_shows_the_overviews_request_rate(db):
    """Sources and the Overview (signals' request_rate_per_s) rate the same requests the same way."""
    from specwatch.collector.reads.reader import signals

    store(db, requests=requests("gpu-0", 5, 0, at=T0 + 300.4) + requests("gpu-0", 3, 10, at=T0 + 700.2))
    (row,) = sources(db, WINDOW)
    assert row.per_s == pytest.approx(signals(db, WINDOW).request_rate_per_s) and row.per_s > 8 / 1000
