"""What a tenant writes affects only that tenant's views (issue 53 #5): its request ids are scoped
(`tenant:id`), so it cannot pre-claim the operator engine's id or another tenant's, and a duplicate
answer tells it nothing about theirs; its deploy markers do not mark the fleet-wide /v1/tune plan stale."""

from __future__ import annotations

import orjson
import pytest
from collector_payloads import T0, event_dict, request_dict
from fastapi.testclient import TestClient
from tuning_payloads import records

from specwatch.collector.reads.queries import Filters, Window
from specwatch.collector.reads.tuning_reads import version_markers
from specwatch.collector.settings import Settings
from specwatch.cost.tuner import TuneRules
from specwatch.cost.tuner_data import recommend_from_store
from specwatch.service.app import create_app

TOKENS = """\
ingest i-acme   tenant=acme   instances=acme-0
ingest i-globex tenant=globex instances=globex-0
read   r-acme   tenant=acme
read   r-globex tenant=globex
"""


@pytest.fixture
def secured(settings: Settings, registry, tmp_path) -> TestClient:
    (tmp_path / "tokens").write_text(TOKENS)
    tokens = dict(ingest_token="i-op", read_token="r-op", tokens_file=tmp_path / "tokens")
    with TestClient(create_app(Settings(**(settings.model_dump() | tokens)), registry)) as client:
        yield client


def send(client: TestClient, token: str, requests=(), events=()) -> dict:
    body = orjson.dumps({"requests": list(requests), "events": list(events)})
    response = client.post("/v1/ingest", content=body, headers={"content-type": "application/json", **bearer(token)})
    assert response.status_code == 200, response.text
    return response.json()


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def test_a_tenant_cannot_pre_claim_the_operators_request_id(secured):
    claimed = send(secured, "i-acme", [request_dict(1, request_id="op-1", instance="acme-0")])
    assert claimed["requests"] == {"accepted": 1, "duplicates": 0}
    operator = send(secured, "i-op", [request_dict(1, request_id="op-1", instance="gpu-0", output_tokens=99)])
    assert operator["requests"] == {"accepted": 1, "duplicates": 0}  # was dropped as a duplicate
    record = secured.get("/v1/requests/op-1", headers=bearer("r-op")).json()["record"]
    assert (record["instance"], record["output_tokens"]) == ("gpu-0", 99)


def test_a_duplicate_answer_reveals_nothing_across_tenants(secured):
    send(secured, "i-globex", [request_dict(1, request_id="secret-7", instance="globex-0")])
    probe = send(secured, "i-acme", [request_dict(1, request_id="secret-7", instance="acme-0", output_tokens=5)])
    assert probe["requests"] == {"accepted": 1, "duplicates": 0} and probe["conflicts"]["count"] == 0
    again = send(secured, "i-acme", [request_dict(1, request_id="secret-7", instance="acme-0", output_tokens=6)])
    assert again["requests"]["duplicates"] == 1 and again["conflicts"]["request_ids"] == ["acme:secret-7"]


def test_each_tenant_opens_its_own_request_by_either_id(secured):
    for tenant in ("acme", "globex"):
        send(secured, f"i-{tenant}", [request_dict(1, request_id="r/1", instance=f"{tenant}-0")])
    for tenant in ("acme", "globex"):
        for asked in ("r%2F1", f"{tenant}:r%2F1"):
            found = secured.get(f"/v1/requests/{asked}", headers=bearer(f"r-{tenant}"))
            assert found.status_code == 200 and found.json()["record"]["instance"] == f"{tenant}-0"
    assert secured.get("/v1/requests/globex:r%2F1", headers=bearer("r-acme")).status_code == 404
    assert secured.get("/v1/requests/acme:r%2F1", headers=bearer("r-op")).status_code == 200


def test_a_scoped_id_past_the_column_is_a_422_naming_it(secured):
    body = orjson.dumps({"requests": [request_dict(1, request_id="x" * 128, instance="acme-0")]})
    response = secured.post(
        "/v1/ingest", content=body, headers={"content-type": "application/json", **bearer("i-acme")}
    )
    assert response.status_code == 422
    (error,) = response.json()["detail"]["errors"]
    assert (error["item"], error["field"]) == ("requests[0]", "request_id") and "at most 123" in error["message"]


def test_a_tenants_deploy_marker_leaves_the_fleet_plan_fresh(secured):
    operator_marker = event_dict(0, instance="gpu-0", at=T0 - 5, kind="config", detail={"version": "0.32.0"})
    send(secured, "i-op", records(), [operator_marker])
    tenant_marker = event_dict(1, instance="acme-0", at=T0 + 4000, kind="config", detail={"version": "0.33.0"})
    send(secured, "i-acme", events=[tenant_marker])
    db, window = secured.app.state.store.db, Window(T0 - 10, T0 + 5000)
    plan = recommend_from_store(db, window, rules=TuneRules(max_batch=16))
    assert not plan.stale and plan.upstream_version == "0.32.0"
    assert [v for _, _, v in version_markers(db, window)] == ["0.32.0"]
    acme = Filters(tags=(("tenant", "acme"),))
    assert [v for _, _, v in version_markers(db, window, acme)] == ["0.32.0", "0.33.0"]  # the tenant's own view
    response = secured.get("/v1/tune", params={"start": T0 - 10, "end": T0 + 5000}, headers=bearer("r-op"))
    assert response.status_code == 200 and not response.json()["stale"]
