"""Hostile query parameters and request ids (issue 53 #6, #7): each is a 4xx naming the parameter, never a
500; a request id with `/` or any other character a client percent-encodes opens."""

from __future__ import annotations

import base64
import json
from urllib.parse import quote

import orjson
import pytest
from collector_payloads import T0, request_dict

JSON = {"content-type": "application/json"}
WINDOW = {"start": T0 - 60, "end": T0 + 600}


def cursor(*parts: object) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(parts)).encode()).decode()


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


@pytest.mark.parametrize("days", ["²", "³", "①", "٣", "1" * 5000, " 3", "3.0", "-1", "0", "91", "+3", ""])
def test_daily_cost_days_must_be_ascii_digits_in_range(client, days):
    response = client.get("/v1/cost/daily", params={"days": days})
    assert response.status_code == 400 and "days must be a whole number" in response.json()["detail"]["message"]


def test_daily_cost_takes_ascii_digits(client):
    assert client.get("/v1/cost/daily", params={"days": "7"}).status_code == 200


@pytest.mark.parametrize(
    "given",
    [
        cursor("time", 10**300, 1),  # a huge sort value
        cursor("time", 1.0, 10**100),  # a row id past int64 (was a 500 on SQLite and PostgreSQL)
        cursor("time", 1.0, -1),
        cursor("time", 1.0, True),
        cursor("time", float("nan"), 1),
        cursor("time", "1", 1),
        base64.urlsafe_b64encode(nested(190).encode()).decode(),
        "é" * 100,
    ],
)
def test_a_forged_cursor_is_a_422(client, given):
    response = client.get("/v1/requests", params={**WINDOW, "cursor": given})
    assert response.status_code == 422 and response.json()["detail"]["error"] == "invalid_cursor"


def test_an_oversized_cursor_is_a_422(client):
    response = client.get("/v1/requests", params={**WINDOW, "cursor": cursor("time", 1.0, 1) * 100})
    assert response.status_code == 422


@pytest.mark.parametrize(
    "config, words",
    [
        (nested(1200), "nested too deeply"),
        ('{"num_speculative_tokens": ' + "9" * 4000 + "}", "from 0 to 64"),
        ('{"num_speculative_tokens": 65}', "from 0 to 64"),
        ('{"num_speculative_tokens": 4, "num_speculative_tokens_per_batch_size": [[1, 8, 99]]}', "from 0 to 64"),
        ('{"num_speculative_tokens": 4, "num_speculative_tokens_per_batch_size": [[2, 8, 2]]}', "start at 1"),
    ],
)
def test_tune_refuses_a_hostile_current_config(client, config, words):
    response = client.get("/v1/tune", params={"current_config": config})
    assert response.status_code == 422 and words in response.json()["detail"]["message"]


@pytest.mark.parametrize("param", ["max_k", "max_batch", "current_k", "min_requests"])
@pytest.mark.parametrize("value", ["²", "9" * 5000, "1e999"])
def test_tune_numbers_must_be_ascii_and_in_range(client, param, value):
    assert client.get("/v1/tune", params={param: value}).status_code == 422


@pytest.mark.parametrize("value", ["²", "1e999", "-5", "nan", "9" * 5000])
def test_window_numbers_must_be_finite_and_in_range(client, value):
    for params in ({"last": value}, {"start": value, "end": T0}, {"step": value, **WINDOW}):
        response = client.get("/v1/series", params=params)
        assert 400 <= response.status_code < 500, (params, response.text[:200])


@pytest.mark.parametrize(
    "request_id", ["a/b", "/lead", "tail/", "a//b", "a?b#c", "50%", "a b+c", "ü/名", "..", "a/../b"]
)
def test_a_request_id_with_any_character_opens(client, request_id):
    record = request_dict(1, request_id=request_id)
    assert client.post("/v1/ingest", content=orjson.dumps({"requests": [record]}), headers=JSON).status_code == 200
    encoded = quote(request_id, safe="").replace(".", "%2E")  # a bare ".." segment is resolved by the client
    response = client.get(f"/v1/requests/{encoded}")
    assert response.status_code == 200 and response.json()["record"]["request_id"] == request_id
