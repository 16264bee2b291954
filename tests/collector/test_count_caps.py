"""Counts the contract caps (issue 53 #1): two records with 2**62 output tokens, allowed before, made every
SUM over their window overflow int64, answered 500 on the read API and stopped every alert rule for every
tenant. Now such a record is refused (ingest and OTLP alike), and records at the caps read and alert."""

from __future__ import annotations

import orjson
import pytest
from collector_payloads import T0, request_dict
from otlp_payloads import export, span

from specwatch.alerts.rules import parse_config
from specwatch.alerts.runner import AlertRunner
from specwatch.alerts.signals import StoreSignals
from specwatch.alerts.store import active_alerts
from specwatch.telemetry.schema import MAX_BYTES, MAX_DRAFT_TOKENS, MAX_TOKENS

JSON = {"content-type": "application/json"}
PROTOBUF = {"content-type": "application/x-protobuf"}
# SpecAcceptanceLow as the default rules have it, firing at once
ACCEPTANCE_RULE = {
    "name": "SpecAcceptanceLow",
    "signal": "acceptance_rate",
    "op": "<",
    "threshold": 0.6,
    "window": "5m",
    "for": "0s",
    "min_samples": 5,
    "group_by": ["instance"],
}
READS = ("signals", "series", "breakdown", "compare", "throughput/by-load", "labels", "sources", "errors/by-hour")


def ingest(client, requests=(), samples=()):
    body = orjson.dumps({"requests": list(requests), "samples": list(samples)})
    return client.post("/v1/ingest", content=body, headers=JSON)


def at_caps(i: int) -> dict:
    """A record with every count at its cap (drafts of 64 tokens, all accepted at position 0 only)."""
    return request_dict(
        i,
        instance="tenant-box",
        prompt_tokens=MAX_TOKENS,
        output_tokens=MAX_TOKENS,
        num_drafts=MAX_TOKENS,
        num_draft_tokens=MAX_DRAFT_TOKENS,
        num_accepted_tokens=MAX_TOKENS,
        accepted_per_position=[MAX_TOKENS, 0, 0, 0],
    )


@pytest.mark.parametrize(
    "field, value",
    [
        ("output_tokens", 2**62),
        ("prompt_tokens", MAX_TOKENS + 1),
        ("num_draft_tokens", MAX_DRAFT_TOKENS + 1),
    ],
)
def test_a_count_past_its_cap_is_a_422_naming_the_field(client, field, value):
    response = ingest(client, [request_dict(1, **{field: value})])
    assert response.status_code == 422
    assert [e["field"] for e in response.json()["detail"]["errors"]] == [field]


def test_a_sample_past_the_byte_cap_is_a_422(client, make_sample):
    assert ingest(client, samples=[make_sample(1, mem_reserved_bytes=MAX_BYTES + 1)]).status_code == 422


def test_an_otlp_span_past_the_token_cap_is_rejected_alone(client):
    spans = [span("cmpl-ok", 0), span("cmpl-huge", 1, **{"gen_ai.usage.completion_tokens": 2**62})]
    response = client.post("/v1/traces", content=export(spans).SerializeToString(), headers=PROTOBUF)
    assert response.status_code == 200
    assert client.get("/v1/requests/cmpl-ok").status_code == 200
    assert client.get("/v1/requests/cmpl-huge").status_code == 404


def test_records_at_the_caps_read_and_alerts_fire_for_the_other_tenants(client):
    """The hostile tenant's records at every cap, and another instance's requests with low acceptance:
    every read answers with exact sums, and the acceptance alert fires for the other instance."""
    low = [request_dict(i, accepted_per_position=[1, 0, 0, 0], num_accepted_tokens=1) for i in range(10, 20)]
    assert ingest(client, [at_caps(1), at_caps(2), *low]).status_code == 200
    window = {"start": T0 - 60, "end": T0 + 60}
    for path in READS:
        assert client.get(f"/v1/{path}", params=window).status_code == 200, path
    by_instance = {
        group["key"]: group
        for group in client.get("/v1/breakdown", params=window | {"by": "instance"}).json()["groups"]
    }
    assert by_instance["tenant-box"]["output_tokens"] == 2 * MAX_TOKENS
    db = client.app.state.store.db
    runner = AlertRunner(db, parse_config({"rules": [ACCEPTANCE_RULE]}), source=StoreSignals(db))
    assert runner.cycle(T0 + 60).errors == {}
    firing = {alert.labels["instance"] for alert in active_alerts(db)[0] if alert.state == "firing"}
    assert firing == {"gpu-0"}
