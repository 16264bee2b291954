"""POST /v1/ingest: whole batches stored once, bad input refused with a 4xx that names the problem."""

from __future__ import annotations

import orjson
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select, text

from specwatch.collector.models import DeviceSampleRow, EngineEventRow, Request
from specwatch.collector.settings import Settings
from specwatch.service.app import create_app


def post(client, payload, **kwargs):
    body = payload if isinstance(payload, bytes) else orjson.dumps(payload)
    return client.post(
        "/v1/ingest", content=body, headers={"content-type": "application/json", **kwargs.pop("headers", {})}, **kwargs
    )


def stored(client, model=Request) -> int:
    with client.app.state.store.db.connect() as conn:
        return conn.scalar(select(func.count()).select_from(model))


def test_valid_batch_is_stored_and_counted(client, make_request, make_sample, make_event):
    payload = {"requests": [make_request(i) for i in range(10)], "samples": [make_sample(1)], "events": [make_event(1)]}
    response = post(client, payload)
    assert response.status_code == 200, response.text
    assert response.json()["accepted"] == 12 and response.json()["duplicates"] == 0
    assert (stored(client), stored(client, DeviceSampleRow), stored(client, EngineEventRow)) == (10, 1, 1)


def test_device_time_is_stored_as_sent_and_left_null_when_not_sent(client, make_request):
    payload = {"requests": [make_request(1, device_s=0.625, device_s_source="processor_sharing"), make_request(2)]}
    assert post(client, payload).status_code == 200
    with client.app.state.store.db.connect() as conn:
        rows = conn.execute(
            select(Request.request_id, Request.device_s, Request.device_s_source).order_by(Request.request_id)
        ).all()
    assert [tuple(row) for row in rows] == [("req-1", 0.625, "processor_sharing"), ("req-2", None, None)]


def test_drafts_per_position_is_stored_as_sent_and_empty_when_not_sent(client, make_request):
    payload = {"requests": [make_request(1, num_draft_tokens=13, drafts_per_position=[4, 4, 3, 2]), make_request(2)]}
    assert post(client, payload).status_code == 200
    with client.app.state.store.db.connect() as conn:
        rows = conn.execute(select(Request.request_id, Request.drafts_per_position).order_by(Request.request_id))
        assert [tuple(row) for row in rows] == [("req-1", [4, 4, 3, 2]), ("req-2", [])]


def test_duplicates_are_counted_and_skipped(client, make_request):
    assert post(client, {"requests": [make_request(1), make_request(2)]}).json()["accepted"] == 2
    body = post(client, {"requests": [make_request(2), make_request(3), make_request(3)]}).json()
    assert body["requests"] == {"accepted": 1, "duplicates": 2}
    assert stored(client) == 3


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"prompt_tokens": "many"}, "prompt_tokens"),  # wrong type
        ({"request_id": None}, "request_id"),
        ({"num_draft_tokens": -1}, "num_draft_tokens"),  # negative count
        ({"num_accepted_tokens": 17}, "num_accepted_tokens"),  # accepted > drafted
        ({"mode": "turbo"}, "mode"),  # unknown enum value
        ({"status": "exploded"}, "status"),
        ({"drafter": "magic"}, "drafter"),
        ({"started_at": 1_780_000_000_000.0}, "started_at"),  # milliseconds, not seconds
        ({"e2e_s": 1e309}, "e2e_s"),  # overflows to inf
        ({"accepted_per_position": [1, 2, 3, 4]}, "accepted_per_position"),  # increasing
        ({"accepted_per_position": [5, 3, 2, 1], "num_accepted_tokens": 11}, "accepted_per_position"),  # > num_drafts
        ({"accepted_per_position": [4, 3, 2, 2]}, "accepted_per_position"),  # sum != num_accepted_tokens
        ({"gamma": 3}, "gamma"),  # len(accepted_per_position) != gamma
        ({"drafts_per_position": [4, 4, 4]}, "drafts_per_position"),  # len != gamma
        ({"drafts_per_position": [3, 4, 4, 5]}, "drafts_per_position"),  # increasing
        ({"drafts_per_position": [4, 4, 4, 3]}, "drafts_per_position"),  # sum != num_draft_tokens
        ({"drafts_per_position": [5, 4, 4, 3]}, "drafts_per_position"),  # > num_drafts
        ({"num_draft_tokens": 10, "drafts_per_position": [4, 2, 2, 2]}, "drafts_per_position"),  # accepted > reached
        ({"energy_j": 3.0}, "energy_source"),
        ({"device_s": 0.5}, "device_s_source"),  # device time without its source
        ({"device_s_source": "engine"}, "device_s"),
        ({"device_s": -0.5, "device_s_source": "engine"}, "device_s"),
        ({"device_s": 0.5, "device_s_source": "guessed"}, "device_s_source"),
        ({"unexpected": 1}, "unexpected"),
        ({"tags": {"k" * 65: "v"}}, "tags.k" + "k" * 64 + ".[key]"),
    ],
)
def test_bad_record_rejects_whole_batch_naming_item_and_field(client, make_request, change, field):
    response = post(client, {"requests": [make_request(1), make_request(2, **change)]})
    assert response.status_code == 422, response.text
    errors = response.json()["detail"]["errors"]
    assert {"item": "requests[1]", "field": field} == {k: errors[0][k] for k in ("item", "field")}
    assert stored(client) == 0


def test_missing_field_is_named(client, make_request):
    record = make_request(1)
    del record["e2e_s"]
    errors = post(client, {"requests": [record]}).json()["detail"]["errors"]
    assert errors[0]["item"] == "requests[0]" and errors[0]["field"] == "e2e_s" and errors[0]["type"] == "missing"


def test_bad_sample_and_event_are_named(client, make_sample, make_event):
    response = post(client, {"samples": [make_sample(1, util_target=1.5)], "events": [make_event(1, kind="party")]})
    assert response.status_code == 422
    named = {(e["item"], e["field"]) for e in response.json()["detail"]["errors"]}
    assert named == {("samples[0]", "util_target"), ("events[0]", "kind")}


@pytest.mark.parametrize(
    "body",
    [
        b"{",
        b"not json",
        b'{"requests": [NaN]}',
        b'{"requests": [{"e2e_s": Infinity}]}',
        b"\xff\xfe",
        b"[" * 5000 + b"]" * 5000,
    ],
)
def test_invalid_json_is_400(client, body):
    response = post(client, body)
    assert response.status_code == 400 and response.json()["detail"]["error"] == "invalid_json"


@pytest.mark.parametrize("body", [b"[]", b"null", b"42", b'"requests"', b'{"requests": {}}', b'{"requests": [1]}'])
def test_wrong_shape_is_422(client, body):
    assert post(client, body).status_code == 422


def test_oversize_body_is_413(client, make_request):
    big = {"requests": [make_request(i) for i in range(1000)]}  # ~500 KB > the fixture's 256 KiB
    assert post(client, big).status_code == 413
    chunked = client.post(
        "/v1/ingest",
        content=iter([orjson.dumps(big)[i : i + 65536] for i in range(0, 600_000, 65536)]),
        headers={"content-type": "application/json"},
    )
    assert chunked.status_code == 413
    assert stored(client) == 0


def test_bearer_token_is_required_when_configured(db_url, tmp_path, make_request):
    settings = Settings(data_dir=tmp_path, database_url=db_url, ingest_token="s3cret", retention_days=36500)
    with TestClient(create_app(settings)) as client:
        payload = {"requests": [make_request(1)]}
        assert post(client, payload).status_code == 401
        assert post(client, payload, headers={"authorization": "Bearer wrong"}).status_code == 401
        assert post(client, payload, headers={"authorization": "Basic s3cret"}).status_code == 401
        assert stored(client) == 0
        assert post(client, payload, headers={"authorization": "Bearer s3cret"}).status_code == 200
        assert stored(client) == 1


def test_health_and_readiness(client):
    assert client.get("/healthz").json() == {"status": "ok"}
    readiness = client.get("/readyz").json()
    assert readiness["status"] == "ready" and readiness["replica"]  # leadership: tests/collector/test_leader.py


@pytest.mark.parametrize("where", ["request_id", "tags", "error"])
def test_nul_characters_are_refused_everywhere(client, make_request, where):
    change = {"tags": {"tenant": "a\x00b"}} if where == "tags" else {where: "a\x00b"}
    response = post(client, {"requests": [make_request(1, **change)]})
    assert response.status_code == 422 and stored(client) == 0


def test_database_trouble_is_503_so_clients_retry(client, make_request):
    db = client.app.state.store.db
    with db.begin() as conn:
        conn.execute(text("ALTER TABLE requests RENAME TO requests_away"))
    try:
        response = post(client, {"requests": [make_request(1)]})
        assert response.status_code == 503 and response.json()["detail"]["error"] == "store_unavailable"
    finally:
        with db.begin() as conn:
            conn.execute(text("ALTER TABLE requests_away RENAME TO requests"))
    assert post(client, {"requests": [make_request(1)]}).status_code == 200
