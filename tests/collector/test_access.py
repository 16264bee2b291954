"""Access control on the collector: bearer tokens with roles (ingest, read, admin), several per role,
from the environment (Settings) and a token file, optionally bound to a tenant.

Every read route of the app is found from `app.routes`, so a route added later cannot slip through
unguarded; /healthz and /readyz stay open."""

from __future__ import annotations

import orjson
import pytest
from collector_payloads import T0, event_dict, request_dict, sample_dict
from fastapi.routing import iter_route_contexts
from fastapi.testclient import TestClient
from sqlalchemy import select

from specwatch.cli import main
from specwatch.collector.models import Request
from specwatch.collector.settings import Settings
from specwatch.service.app import create_app

OPEN = {"/healthz", "/readyz"}
ADMIN = {"/v1/report", "/v1/captures"}
REPORT = "specwatch-report-2026-05.html"
# Endpoints over data that carries no tenant: a tenant-bound token is refused there.
UNSCOPED = (
    "/v1/devices/latest",
    "/v1/devices/series",
    "/v1/events",
    "/v1/vllm/signals",
    "/v1/sources",
    "/v1/alerts",
    "/v1/alerts/history",
    "/v1/cost",
    "/v1/reports",
    f"/v1/reports/{REPORT}",
    "/metrics",
)
TOKEN_FILE = """\
# role token [tenant=NAME [instances=A,B]]
read   r-file
admin  a-file
ingest i-acme   tenant=acme   instances=acme-0,acme-1
ingest i-globex tenant=globex instances=gpu-0
read   r-acme   tenant=acme
"""
WINDOW = {"start": T0 - 10, "end": T0 + 3600, "month": "2026-05"}


@pytest.fixture
def secured(settings: Settings, registry, tmp_path) -> TestClient:
    """The collector with tokens from the settings (two read tokens: rotation) and from a file."""
    (tmp_path / "tokens").write_text(TOKEN_FILE)
    (tmp_path / "reports").mkdir()
    (tmp_path / "reports" / REPORT).write_text("<html></html>")
    tokens = dict(ingest_token="i1", read_token="r1, r2", admin_token="a1", tokens_file=tmp_path / "tokens")
    secured = Settings(**(settings.model_dump() | tokens | {"report_dir": tmp_path / "reports"}))
    with TestClient(create_app(secured, registry)) as client:
        yield client


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


def read_routes(client: TestClient) -> list[str]:
    """Every path of the app but ingest and the open health checks (path parameters filled in);
    all of them GETs, so a route of another kind added later makes the tests look at it."""
    writes = {
        ("/v1/captures", "POST")
    }  # producers' captures, behind the ingest token (tests/collector/test_captures.py)
    routes = [
        r
        for r in iter_route_contexts(client.app.routes)
        if r.path not in OPEN | {"/v1/ingest", "/v1/traces"} and not {(r.path, m) for m in r.methods} <= writes
    ]
    assert all(r.methods == {"GET"} for r in routes), [(r.path, r.methods) for r in routes]
    return [r.path.replace("{name}", REPORT).replace("{request_id:path}", "req-1") for r in routes]


def ingest(client: TestClient, records: list[dict], token: str | None = None, samples: list[dict] = ()):
    body = orjson.dumps({"requests": records, "samples": list(samples)})
    headers = {"content-type": "application/json", **(bearer(token) if token else {})}
    return client.post("/v1/ingest", content=body, headers=headers)


def test_every_read_route_needs_a_read_token(secured):
    assert ingest(secured, [request_dict(1)], "i1").status_code == 200  # the request /v1/requests/req-1 reads
    routes = read_routes(secured)
    assert {"/v1/signals", "/v1/cost", "/v1/alerts", "/metrics", "/docs", "/redoc", "/openapi.json"} <= set(routes)
    for path in routes:
        refused = secured.get(path, params=WINDOW)
        assert refused.status_code == 401, path
        assert refused.headers["www-authenticate"] == "Bearer"
        assert "bearer token" in refused.json()["detail"]["message"]
        assert secured.get(path, params=WINDOW, headers=bearer("nobody")).status_code == 401, path
        assert secured.get(path, params=WINDOW, headers=bearer("i1")).status_code == 403, path
        assert secured.get(path, params=WINDOW, headers=bearer("a1")).status_code == 200, path
        for token in ("r1", "r2", "r-file"):  # several read tokens at once: rotation
            expected = 403 if path in ADMIN else 200
            assert secured.get(path, params=WINDOW, headers=bearer(token)).status_code == expected, (path, token)


def test_health_checks_stay_open(secured):
    assert secured.get("/healthz").status_code == 200
    assert secured.get("/readyz").status_code == 200


def test_bearer_scheme_is_case_insensitive(secured):
    assert secured.get("/v1/signals", headers={"authorization": "bearer r1"}).status_code == 200
    assert secured.get("/v1/signals", headers={"authorization": "Basic r1"}).status_code == 401


def test_ingest_needs_an_ingest_token_and_counts_refusals(secured, registry):
    def refused(reason: str) -> float:
        return registry.get_sample_value("specwatch_ingest_rejected_batches_total", {"reason": reason}) or 0.0

    assert ingest(secured, [request_dict(1)]).status_code == 401
    assert ingest(secured, [request_dict(1)], "r1").status_code == 403
    assert ingest(secured, [request_dict(1)], "a1").status_code == 403  # admin is not ingest
    assert (refused("unauthorized"), refused("forbidden")) == (1.0, 2.0)
    assert ingest(secured, [request_dict(1)], "i1").status_code == 200


def test_metrics_can_be_made_public(settings, registry):
    public = Settings(**(settings.model_dump() | {"read_token": "r1", "metrics_public": True}))
    with TestClient(create_app(public, registry)) as client:
        assert client.get("/metrics").status_code == 200
        assert client.get("/v1/signals").status_code == 401


def test_without_tokens_everything_is_open(client):
    for path in read_routes(client):
        assert client.get(path, params=WINDOW).status_code in (200, 404), path  # no report directory: 404
    assert ingest(client, [request_dict(1)]).status_code == 200


def stored_tenants(client: TestClient) -> dict[str, str]:
    with client.app.state.store.db.connect() as conn:
        return {rid: tags.get("tenant") for rid, tags in conn.execute(select(Request.request_id, Request.tags))}


def acme(i: int) -> dict:
    return request_dict(i, instance="acme-0")


def test_a_tenant_bound_ingest_token_stamps_its_tenant(secured):
    # request_dict tags odd ids "acme", even ids "globex": the token's tenant wins
    assert ingest(secured, [request_dict(i) for i in range(4)], "i-globex", [sample_dict(1)]).status_code == 200
    assert ingest(secured, [acme(i) for i in range(4, 7)], "i-acme").status_code == 200
    assert ingest(secured, [request_dict(7)], "i1").status_code == 200  # unbound: the producer's tag stays
    # a tenant-bound token's ids are scoped to its tenant (issue 53 #5)
    expected = {f"globex:req-{i}": "globex" for i in range(4)} | {f"acme:req-{i}": "acme" for i in range(4, 7)}
    assert stored_tenants(secured) == expected | {"req-7": "acme"}


def stored_counts(client: TestClient) -> tuple[int, int, int]:
    with client.app.state.store.db.connect() as conn:
        return tuple(conn.exec_driver_sql(f"SELECT count(*) FROM {t}").scalar() for t in TABLES)


TABLES = ("requests", "device_samples", "engine_events")


@pytest.mark.parametrize(
    "batch, blamed",
    [
        ({"samples": [sample_dict(1, instance="acme-0"), sample_dict(2)]}, "samples[1]"),  # globex's gpu-0
        ({"events": [event_dict(1, instance="shared-engine")]}, "events[0]"),
        ({"requests": [request_dict(1, instance="acme-1"), request_dict(2)]}, "requests[1]"),
    ],
)
def test_a_tenant_bound_ingest_token_writes_only_its_own_instances(secured, batch, blamed):
    """Issue 30 #1: a tenant's token wrote samples and events for any instance, and requests that fed the
    per-instance alerts of a shared engine (whose remediation defragments it or unloads its draft)."""
    headers = {"content-type": "application/json", **bearer("i-acme")}
    before = stored_counts(secured)
    refused = secured.post("/v1/ingest", content=orjson.dumps(batch), headers=headers)
    assert refused.status_code == 403, refused.text
    detail = refused.json()["detail"]
    assert detail["errors"][0]["item"] == blamed and detail["errors"][0]["field"] == "instance"
    assert "not bound to this token's tenant 'acme'" in detail["message"]
    assert stored_counts(secured) == before  # nothing of the batch stored
    unbound = secured.post("/v1/ingest", content=orjson.dumps(batch), headers={**headers, **bearer("i1")})
    assert unbound.status_code == 200  # an ingest token bound to no tenant writes any instance


def test_a_tenant_bound_read_token_sees_only_its_tenant(secured):
    assert ingest(secured, [request_dict(i) for i in range(6)], "i-globex").status_code == 200
    assert ingest(secured, [acme(i) for i in range(6, 10)], "i-acme").status_code == 200

    def requests(token: str, **params) -> int:
        response = secured.get("/v1/signals", params=WINDOW | params, headers=bearer(token))
        assert response.status_code == 200, response.text
        return response.json()["requests"]

    assert requests("r1") == 10 and requests("r-acme") == 4
    assert requests("r-acme", tag="tenant:globex") == 0  # asking for another tenant's rows finds none
    labels = secured.get("/v1/labels", params=WINDOW, headers=bearer("r-acme")).json()
    assert labels["instance"] == {"acme-0": 4}
    breakdown = secured.get("/v1/breakdown", params=WINDOW | {"by": "tag:tenant"}, headers=bearer("r-acme")).json()
    assert [(g["key"], g["requests"]) for g in breakdown["groups"]] == [("acme", 4)]


def test_a_tenant_bound_read_token_is_refused_where_rows_carry_no_tenant(secured):
    for path in UNSCOPED:
        response = secured.get(path, params=WINDOW, headers=bearer("r-acme"))
        assert response.status_code == 403, path
        assert "bound to tenant 'acme'" in response.json()["detail"]["message"], path
        assert secured.get(path, params=WINDOW, headers=bearer("r1")).status_code == 200, path
    assert secured.get("/v1/rules", headers=bearer("r-acme")).status_code == 200  # configuration, no tenant's data


def serve(monkeypatch, capsys, *args: str, **env: str) -> tuple[int, str]:
    """`specwatch collector serve ARGS` with only `env`'s tokens set: (exit code, stderr)."""
    for name in ("INGEST_TOKEN", "READ_TOKEN", "ADMIN_TOKEN", "TOKENS_FILE"):
        monkeypatch.delenv(f"SPECWATCH_{name}", raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    code = main(["collector", "serve", "--port", "18198", *args])
    return code, capsys.readouterr().err


@pytest.mark.parametrize(
    "content, message",
    [
        ("reader r1\n", "tokens:1: expected 'ROLE TOKEN [tenant=NAME [instances=A,B]]'"),
        ("read r1\nread r2 acme\n", "tokens:2: expected"),
        ("read r1 tenant=\n", "tokens:1: expected"),
        ("ingest i1 tenant=acme\n", "tokens:1: an ingest token bound to a tenant must name its instances"),
        ("ingest i1 instances=a\n", "tokens:1: instances= binds a tenant's ingest token"),
        ("ingest i1 tenant=a instances=x\ningest i2 tenant=b instances=x,y\n", "instance 'x' is bound to tenants"),
    ],
)
def test_a_bad_token_file_stops_serve_with_one_line(monkeypatch, capsys, tmp_path, content, message):
    (tmp_path / "tokens").write_text(content)
    code, err = serve(monkeypatch, capsys, SPECWATCH_TOKENS_FILE=str(tmp_path / "tokens"))
    assert code == 2 and message in err and len(err.strip().splitlines()) == 1 and "Traceback" not in err


def test_a_missing_token_file_stops_serve(monkeypatch, capsys, tmp_path):
    code, err = serve(monkeypatch, capsys, SPECWATCH_TOKENS_FILE=str(tmp_path / "absent"))
    assert code == 2 and "cannot read the token file" in err


def test_a_public_host_without_tokens_is_refused_unless_insecure(monkeypatch, capsys, tmp_path):
    code, err = serve(monkeypatch, capsys, "--host", "0.0.0.0")
    assert code == 2 and "refusing to listen on 0.0.0.0 with no token configured" in err
    assert "--insecure" in err and len(err.strip().splitlines()) == 1
    # Past the exposure check, serve stops at the next one (a missing rules file): nothing is bound.
    rules = str(tmp_path / "no-rules.yaml")
    for args, env in (
        (("--host", "0.0.0.0", "--insecure"), {}),
        (("--host", "10.1.2.3"), {"SPECWATCH_READ_TOKEN": "r1"}),
        (("--host", "::1"), {}),
        (("--host", "localhost"), {}),
    ):
        code, err = serve(monkeypatch, capsys, *args, "--alert-rules", rules, **env)
        assert code == 2 and "cannot read rules file" in err and "refusing" not in err, args
