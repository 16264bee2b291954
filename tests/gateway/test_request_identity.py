"""One request through the real gateway and the real engine is one request at the collector: the
engine records it under the id and arrival time the gateway forwards (`x-request-id`,
`x-specwatch-started-at`), so the two records share the store's key on SQLite (request_id) and on
PostgreSQL (request_id, started_at), and the two merge into one row by one rule (docs/gateway.md). Both name the
engine's own instance (its `x-specwatch-instance`, the name its samples and bill carry), so whichever
arrives first, the request is the engine instance's; the gateway's record keeps the upstream's name in the
`upstream` tag (issue 52: one identity per request and per instance)."""

from __future__ import annotations

import httpx
import pytest
from engine_harness import BackgroundServer
from gateway_harness import GatewayServer
from sqlalchemy import select
from waiting import wait_for

from specwatch.collector.ingest.store import Store
from specwatch.collector.models import Request
from specwatch.engine.policy import PolicyConfig
from specwatch.engine.scheduler import SchedulerConfig
from specwatch.telemetry.schema import IngestBatch, RequestRecord

BODY = {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 4, "temperature": 0}


@pytest.fixture(scope="module")
def upstream(bundled_engine):
    with BackgroundServer(bundled_engine, SchedulerConfig(slots=2, max_queue=8), PolicyConfig()) as server:
        yield server


@pytest.fixture(scope="module")
def gateway(upstream):
    with GatewayServer([f"spec1={upstream.url},drafter=ngram,gamma=8"]) as gw:
        yield gw


def through(gateway: GatewayServer, upstream: BackgroundServer, headers: dict) -> tuple[RequestRecord, RequestRecord]:
    """(the gateway's record, the engine's) of one request sent to the gateway with `headers`."""
    seen, served = len(gateway.records), len(upstream.records)
    response = httpx.post(f"{gateway.url}/v1/chat/completions", json=BODY, headers=headers, timeout=120)
    assert response.status_code == 200, response.text
    gateway_record = gateway.wait_records(seen + 1)[-1]
    engine_record = wait_for(lambda: len(upstream.records) > served and upstream.records[-1], "the engine's record")
    assert response.headers["x-specwatch-request-id"] == gateway_record.request_id
    return gateway_record, engine_record


@pytest.mark.parametrize("headers", [{}, {"x-request-id": "client-key-42"}], ids=["gateway id", "client id"])
def test_the_engine_records_the_request_under_the_gateways_id_and_arrival(gateway, upstream, headers):
    gateway_record, engine_record = through(gateway, upstream, headers)
    assert engine_record.request_id == gateway_record.request_id
    assert gateway_record.request_id == headers.get("x-request-id", gateway_record.request_id)
    assert engine_record.started_at == gateway_record.started_at  # exactly: the PostgreSQL key's second half
    assert gateway_record.instance == engine_record.instance == "test"  # the engine's --instance
    assert gateway_record.tags["upstream"] == "spec1" and "upstream" not in engine_record.tags


@pytest.mark.parametrize("engine_first", [False, True], ids=["gateway first", "engine first"])
def test_both_records_are_stored_once_under_the_engines_instance_whichever_comes_first(
    gateway, upstream, db, engine_first
):
    """`db`: the test database (SQLite, then PostgreSQL when one is available)."""
    gateway_record, engine_record = through(gateway, upstream, {})
    first, second = (engine_record, gateway_record) if engine_first else (gateway_record, engine_record)
    store = Store(db)
    stored, again = store.insert(IngestBatch(requests=[first])), store.insert(IngestBatch(requests=[second]))
    assert (stored.requests, again.requests, again.request_duplicates) == (1, 0, 1)
    assert (again.conflicts, again.conflict_ids) == (0, ())  # another producer's record of it: no conflict
    with db.connect() as conn:
        query = select(Request.instance, Request.e2e_s).where(Request.request_id == engine_record.request_id)
        rows = conn.execute(query).all()
    # one row, the engine's instance and the gateway's (the client's) e2e whichever came first (ingest.merge)
    assert [tuple(r) for r in rows] == [("test", pytest.approx(gateway_record.e2e_s))]


@pytest.mark.parametrize("request_id", ["x" * 129, "two words", ""])
def test_a_malformed_client_request_id_is_refused_by_the_gateway(gateway, upstream, request_id):
    served = len(upstream.records)
    response = httpx.post(f"{gateway.url}/v1/chat/completions", json=BODY, headers={"x-request-id": request_id})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["param"] == "x-request-id" and "printable ASCII" in error["message"]
    assert len(upstream.records) == served  # it never reached the engine


@pytest.mark.parametrize("value", [None, "", "two words", "x" * 129, "tab\there"])
def test_an_upstreams_malformed_instance_name_is_ignored(value):
    from specwatch.common.http import reported_instance

    assert reported_instance(value) is None
    assert reported_instance("gpu-0") == "gpu-0"
