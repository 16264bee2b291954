"""The hostile ingest inputs of issue 30's probe: every one is a 4xx naming what is wrong (never a 5xx),
and no table changes. Among them the regressions of #3 (an event `detail` nested a few hundred levels
was a 500: RecursionError in repr) and #8 (`"20"` and `true` were taken as counts)."""

from __future__ import annotations

import gzip

import orjson
import pytest
from collector_payloads import event_dict, request_dict, sample_dict

from specwatch.telemetry.schema import MAX_DETAIL_DEPTH

JSON = {"content-type": "application/json"}
TABLES = ("requests", "device_samples", "engine_events")


def nested(depth: int) -> bytes:
    """An event whose detail is {"a": [{"a": [...]}]}, objects in lists `depth` levels deep (as text:
    orjson writes at most 254 levels)."""
    opening = b"".join(b'{"a":' if level % 2 == 0 else b"[" for level in range(depth))
    closing = b"".join(b"}" if level % 2 == 0 else b"]" for level in reversed(range(depth)))
    event = evt(detail={"a": 0}).replace(b'{"a":0}', opening + b"1" + closing)
    return event


def req(**changes) -> bytes:
    return orjson.dumps({"requests": [request_dict(1, **changes)]})


def smp(**changes) -> bytes:
    return orjson.dumps({"samples": [sample_dict(1, **changes)]})


def evt(**changes) -> bytes:
    return orjson.dumps({"events": [event_dict(1, **changes)]})


# (body, expected status): request bodies a hostile or broken producer sends
HOSTILE = {
    "deep detail 300": (nested(300), 422),
    "deep detail 500": (nested(500), 422),
    "detail one level too deep": (nested(MAX_DETAIL_DEPTH + 1), 422),
    "wide detail": (evt(detail={f"k{i}": "x" * 50 for i in range(200)}), 422),
    "detail not an object": (evt(detail=[1, 2]), 422),
    "count as string": (req(prompt_tokens="20"), 422),
    "count as true": (req(output_tokens=True), 422),
    "count as float": (req(prompt_tokens=20.5), 422),
    "whole float as count": (req(prompt_tokens=20.0), 422),
    "seconds as string": (req(e2e_s="1.0"), 422),
    "bool as string": (req(draft_counts_known="yes"), 422),
    "bool as int": (smp(draft_loaded=1), 422),
    "sample count as string": (smp(mem_allocated_bytes="1000"), 422),
    "gamma as string": (req(gamma="4"), 422),
    "negative count": (req(prompt_tokens=-1), 422),
    "huge count": (req(prompt_tokens=2**63 - 1), 422),
    "count past 64 bits": (req(prompt_tokens=123456).replace(b":123456,", b":" + str(2**70).encode() + b","), 422),
    "epoch in ms": (req(started_at=1_780_000_000_000), 422),
    "epoch 0": (req(started_at=0), 422),
    "negative seconds": (req(e2e_s=-1), 422),
    "seconds past a day": (req(e2e_s=1e9), 422),
    "NUL in id": (req(request_id="a\u0000b"), 422),
    "empty id": (req(request_id=""), 422),
    "id too long": (req(request_id="x" * 129), 422),
    "unknown field": (req(extra="x"), 422),
    "unknown mode": (req(mode="turbo"), 422),
    "unknown status": (req(status="fine"), 422),
    "bad drafter": (req(drafter="model:/etc/passwd x"), 422),
    "per-position too long": (req(accepted_per_position=[0] * 65, gamma=65), 422),
    "per-position increasing": (req(accepted_per_position=[1, 2, 3, 3], num_accepted_tokens=9), 422),
    "accepted over drafted": (req(num_accepted_tokens=99), 422),
    "too many tags": (req(tags={f"k{i}": "v" for i in range(17)}), 422),
    "tag value not a string": (req(tags={"tenant": 1}), 422),
    "tags not an object": (req(tags=["a"]), 422),
    "energy without source": (req(energy_j=1.0), 422),
    "device_s without source": (req(device_s=1.0), 422),
    "fraction over 1": (smp(util_target=1.5), 422),
    "power without source": (smp(power_source=None), 422),
    "unknown event kind": (evt(kind="reboot"), 422),
    "event at as string": (evt(at="1780000000"), 422),
    "records not a list": (orjson.dumps({"requests": {"a": 1}}), 422),
    "record not an object": (orjson.dumps({"requests": [1]}), 422),
    "unknown top-level key": (orjson.dumps({"rows": []}), 422),
    "top level a list": (b"[]", 422),
    "top level a string": (b'"x"', 422),
    "top level null": (b"null", 422),
    "empty body": (b"", 400),
    "truncated JSON": (req()[:-5], 400),
    "NaN literal": (req().replace(b'"e2e_s":1.1', b'"e2e_s":NaN'), 400),
    "Infinity literal": (req().replace(b'"e2e_s":1.1', b'"e2e_s":Infinity'), 400),
    "invalid UTF-8": (req().replace(b"req-1", b"req-\xff"), 400),
    "lone surrogate": (req().replace(b"req-1", b"req-\\ud800"), 400),
    "JSON nested past the parser's limit": (b"[" * 2000 + b"]" * 2000, 400),
    "trailing garbage": (req() + b"x", 400),
    "BOM": (b"\xef\xbb\xbf" + req(), 400),
}


def counts(client) -> tuple[int, ...]:
    with client.app.state.store.db.connect() as conn:
        return tuple(conn.exec_driver_sql(f"SELECT count(*) FROM {table}").scalar() for table in TABLES)


def test_hostile_ingest_inputs_are_4xx_and_store_nothing(client):
    assert client.post("/v1/ingest", content=req(), headers=JSON).status_code == 200  # one valid row first
    before = counts(client)
    answers = {}
    for name, (body, _) in HOSTILE.items():
        response = client.post("/v1/ingest", content=body, headers=JSON)
        answers[name] = response.status_code
        assert response.status_code < 500 and "error" in response.json().get("detail", {}), (name, response.text[:300])
    assert answers == {name: expected for name, (_, expected) in HOSTILE.items()}
    assert counts(client) == before


@pytest.mark.parametrize(
    "headers, body, status",
    [
        ({"content-type": "text/plain"}, req(), 415),
        ({"content-type": "application/x-www-form-urlencoded"}, b"a=1", 415),
        ({**JSON, "content-encoding": "br"}, req(), 415),
        ({**JSON, "content-encoding": "gzip"}, b"not gzip", 400),
        ({**JSON, "content-encoding": "gzip"}, gzip.compress(req())[:-4], 400),
        ({**JSON, "content-encoding": "gzip"}, gzip.compress(b" " * 50_000_000), 413),
    ],
)
def test_hostile_encodings_are_4xx_and_store_nothing(client, headers, body, status):
    before = counts(client)
    assert client.post("/v1/ingest", content=body, headers=headers).status_code == status
    assert counts(client) == before


def test_a_deeply_nested_detail_is_named_in_the_refusal(client):
    response = client.post("/v1/ingest", content=nested(400), headers=JSON)
    assert response.status_code == 422  # was a 500 (RecursionError in repr), which the client retries forever
    (error,) = response.json()["detail"]["errors"]
    assert error["item"] == "events[0]" and error["field"] == "detail"
    assert f"nested deeper than {MAX_DETAIL_DEPTH} levels" in error["message"]
    assert client.post("/v1/ingest", content=nested(MAX_DETAIL_DEPTH), headers=JSON).status_code == 200


def test_a_count_must_be_a_json_integer(client):
    response = client.post("/v1/ingest", content=req(prompt_tokens="20", output_tokens=True), headers=JSON)
    assert response.status_code == 422
    fields = {e["field"] for e in response.json()["detail"]["errors"]}
    assert fields == {"prompt_tokens", "output_tokens"}
    assert client.post("/v1/ingest", content=req(e2e_s=2), headers=JSON).status_code == 200  # an int is a number
