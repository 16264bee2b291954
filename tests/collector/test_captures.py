"""The collector's captures (issue 56): their own table, admin-only reads, tenant isolation, the caps,
the collector's own redaction, and retention through the maintenance pass."""

from __future__ import annotations

import time

import orjson
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from specwatch.collector import maintenance
from specwatch.collector.models import CaptureRow, Request
from specwatch.collector.settings import Settings
from specwatch.service.app import create_app
from specwatch.telemetry.capture import MAX_CAPTURE_CHARS

TOKENS = """\
admin  a-all
read   r-all
ingest i-all
admin  a-acme  tenant=acme
ingest i-acme  tenant=acme   instances=acme-0
ingest i-globex tenant=globex instances=globex-0
"""
SECRET = "4111-1111-1111-1111"


def capture(i: int, instance: str = "engine-0", **overrides) -> dict:
    now = time.time()
    return {
        "capture_id": f"req-{i}",
        "instance": instance,
        "model": "smollm2",
        "drafter": "early-exit:4",
        "kind": "chat",
        "tags": {"tenant": "acme" if i % 2 else "globex", "scenario": "chat" if i % 3 else "code"},
        "started_at": now - 10,
        "prompt": [{"role": "user", "content": f"question {i}"}],
        "output": f"answer {i}",
        "prompt_tokens": 10 + i,
        "output_tokens": 5,
        "num_draft_tokens": 16,
        "num_accepted_tokens": i % 16,
        "expires_at": now + 3600,
        **overrides,
    }


@pytest.fixture
def secured(settings: Settings, registry, tmp_path) -> TestClient:
    (tmp_path / "tokens").write_text(TOKENS)
    extra = {"tokens_file": tmp_path / "tokens", "capture_redact": [r"\d{4}-\d{4}-\d{4}-\d{4}"]}
    with TestClient(create_app(Settings(**(settings.model_dump() | extra)), registry)) as client:
        yield client


def post(client: TestClient, captures: list[dict], token: str):
    headers = {"content-type": "application/json", "authorization": f"Bearer {token}"}
    return client.post("/v1/captures", content=orjson.dumps({"captures": captures}), headers=headers)


def get(client: TestClient, token: str, **params):
    return client.get("/v1/captures", params=params, headers={"authorization": f"Bearer {token}"})


def rows(client: TestClient) -> list:
    with client.app.state.store.db.connect() as conn:
        return conn.execute(select(CaptureRow)).all()


def test_captures_live_apart_from_request_rows_and_only_admin_reads_them(secured):
    stored = post(secured, [capture(i) for i in range(6)], "i-all")
    assert stored.status_code == 200 and stored.json() == {"stored": 6, "duplicates": 0, "over_cap": 0}
    assert post(secured, [capture(1)], "i-all").json()["duplicates"] == 1
    with secured.app.state.store.db.connect() as conn:
        assert conn.scalar(select(func.count()).select_from(Request)) == 0  # never a request row
    assert get(secured, "r-all").status_code == 403 and get(secured, "i-all").status_code == 403
    assert secured.get("/v1/captures").status_code == 401
    page = get(secured, "a-all", scenario="chat", below_acceptance=0.2).json()
    assert [c["capture_id"] for c in page["captures"]] == ["req-1", "req-2"]  # chat, 1/16 and 2/16 accepted
    first = get(secured, "a-all", limit=4).json()
    rest = get(secured, "a-all", limit=4, after_id=first["next_after_id"]).json()
    assert len(first["captures"]) + len(rest["captures"]) == 6 and rest["next_after_id"] is None


def test_a_tenant_token_never_sees_another_tenants_text(secured):
    assert post(secured, [capture(i, "acme-0") for i in (0, 2)], "i-acme").status_code == 200  # globex-tagged
    assert post(secured, [capture(i, "globex-0") for i in (1, 3)], "i-globex").status_code == 200
    refused = post(secured, [capture(5, "globex-0")], "i-acme")
    assert refused.status_code == 403 and "not bound to this token's tenant" in refused.json()["detail"]["message"]
    mine = get(secured, "a-acme").json()["captures"]
    assert sorted(c["capture_id"] for c in mine) == ["acme:req-0", "acme:req-2"]  # the token's tenant wins
    assert {c["tenant"] for c in mine} == {"acme"} and all("globex" not in c["output"] for c in mine)
    assert get(secured, "a-acme", tenant="globex").status_code == 403
    assert {c["tenant"] for c in get(secured, "a-all").json()["captures"]} == {"acme", "globex"}


def test_the_collector_redacts_and_refuses_huge_texts_before_writing(secured):
    leaked = capture(1, prompt=[{"role": "user", "content": f"card {SECRET}"}], output=f"ok {SECRET}")
    assert post(secured, [leaked], "i-all").status_code == 200
    (row,) = rows(secured)
    assert SECRET not in orjson.dumps(row.prompt).decode() + row.output and row.redactions == 2
    huge = capture(2, output="x" * (MAX_CAPTURE_CHARS + 1))
    refused = post(secured, [huge], "i-all")
    assert refused.status_code == 422 and "captures.0.output" in refused.json()["detail"]["message"]
    body = post(secured, [capture(3, output="y" * MAX_CAPTURE_CHARS)] * 20, "i-all")  # over max_body_bytes
    assert body.status_code == 413 and len(rows(secured)) == 1


def test_the_table_holds_at_most_its_total_of_text(settings, registry):
    capped = Settings(**(settings.model_dump() | {"capture_max_total_chars": 40}))
    with TestClient(create_app(capped, registry)) as client:
        answer = post(client, [capture(i) for i in range(5)], "none").json()  # no tokens: open
        assert answer == {"stored": 2, "duplicates": 0, "over_cap": 3}  # 18 + 18 characters fit in 40


def test_retention_deletes_captures(secured):
    now = time.time()
    kept, gone = capture(1, expires_at=now + 3600), capture(2, expires_at=now + 60)
    assert post(secured, [kept, gone], "i-all").json()["stored"] == 2
    store, settings = secured.app.state.store, secured.app.state.settings
    maintenance.run_once(store, settings, now=now + 120)
    assert [r.capture_id for r in rows(secured)] == ["req-1"]
    maintenance.run_once(store, settings, now=now + settings.capture_retention_days * 86400 + 1)
    assert rows(secured) == []  # the collector's own cap, whatever a producer asked
