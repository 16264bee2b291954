"""The HTTP edges the engine and the gateway share (common.http), on a real Starlette app: OpenAI's
error shape by status, the control-token guard, and the checks on an incoming request id and arrival."""

from __future__ import annotations

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from specwatch.common.http import (
    ERROR_HANDLERS,
    MAX_CLOCK_SKEW_S,
    ApiKeyMiddleware,
    ControlGuard,
    OpenAIError,
    incoming_request_id,
    incoming_started_at,
)

NOW = 1.8e9


def client(token: str | None = "s3cret") -> TestClient:
    guard = ControlGuard(token, "gateway")

    async def control(request: Request) -> JSONResponse:
        guard(request)
        return JSONResponse({"ok": True})

    async def identity(request: Request) -> JSONResponse:
        return JSONResponse({"id": incoming_request_id(request), "at": incoming_started_at(request, NOW)})

    async def refuse(request: Request) -> JSONResponse:
        raise OpenAIError(int(request.path_params["status"]), "no", param="p")

    routes = [
        Route("/control", control, methods=["POST"]),
        Route("/identity", identity),
        Route("/refuse/{status}", refuse),
    ]
    return TestClient(Starlette(routes=routes, exception_handlers=ERROR_HANDLERS))


@pytest.mark.parametrize(
    "status,kind",
    [(400, "invalid_request_error"), (401, "authentication_error"), (403, "permission_error")]
    + [(404, "not_found_error"), (409, "invalid_request_error"), (429, "rate_limit_error"), (502, "server_error")],
)
def test_the_error_type_follows_the_status(status, kind):
    answer = client().get(f"/refuse/{status}")
    assert answer.status_code == status
    assert answer.json() == {"error": {"message": "no", "type": kind, "param": "p", "code": None}}


def test_framework_refusals_are_openai_errors_naming_the_route():
    answer = client().get("/nowhere")
    assert answer.status_code == 404 and answer.json()["error"]["message"] == "GET /nowhere: Not Found"
    assert client().get("/control").json()["error"]["type"] == "invalid_request_error"  # 405


def test_the_control_guard():
    assert client().post("/control", headers={"authorization": "bearer s3cret"}).json() == {"ok": True}
    for headers in ({}, {"authorization": "Bearer nope"}, {"authorization": "s3cret"}):
        refused = client().post("/control", headers=headers)
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
    off = client(token=None).post("/control", headers={"authorization": "Bearer s3cret"})
    assert off.status_code == 403 and "start the gateway with --control-token" in off.json()["error"]["message"]


@pytest.mark.parametrize(
    "headers,expected",
    [
        ({}, {"id": None, "at": None}),
        ({"x-request-id": "a" * 128}, {"id": "a" * 128, "at": None}),
        ({"x-request-id": "r~1", "x-specwatch-started-at": repr(NOW - 1.5)}, {"id": "r~1", "at": NOW - 1.5}),
        ({"x-specwatch-started-at": repr(NOW - MAX_CLOCK_SKEW_S - 1)}, {"id": None, "at": None}),  # skewed: own clock
    ],
)
def test_an_incoming_identity_is_taken(headers, expected):
    assert client().get("/identity", headers=headers).json() == expected


@pytest.mark.parametrize(
    "header,value",
    [("x-request-id", value) for value in ("a" * 129, "a b", "a\tb", "", "é".encode("latin-1"))]
    + [("x-specwatch-started-at", value) for value in ("soon", "inf", "nan")],
)
def test_a_malformed_identity_is_a_400_naming_the_header(header, value):
    answer = client().get("/identity", headers={header: value})
    assert answer.status_code == 400 and answer.json()["error"]["param"] == header


def keyed(keys: str = "k1, k2") -> TestClient:
    """A Starlette app with the OpenAI routes' API key, as the engine and the gateway add it."""

    async def ok(request: Request) -> JSONResponse:
        return JSONResponse({"ok": True, "body": (await request.body()).decode()})

    routes = [Route(path, ok, methods=["GET", "POST"]) for path in ("/v1/chat/completions", "/v1/models", "/health")]
    routes.append(Route("/v1/control/state", ok))
    app = Starlette(routes=routes, exception_handlers=ERROR_HANDLERS)
    app.add_middleware(ApiKeyMiddleware, keys=keys)
    return TestClient(app)


def test_the_api_key_guards_the_v1_routes_in_openais_shape():
    app = keyed()
    for headers in ({}, {"authorization": "Bearer nope"}, {"authorization": "k1"}, {"authorization": "Bearer k1,k2"}):
        refused = app.post("/v1/chat/completions", content=b"{not json", headers=headers)
        assert refused.status_code == 401 and refused.headers["www-authenticate"] == "Bearer"
        error = refused.json()["error"]
        assert error["type"] == "authentication_error" and error["code"] == "invalid_api_key"
        assert "k1" not in error["message"]  # the key is never echoed
    assert app.get("/v1/models").status_code == 401


def test_every_listed_key_passes_and_probes_stay_open():
    app = keyed()
    for key in ("k1", "k2"):  # rotation: both accepted
        answer = app.post("/v1/chat/completions", content=b"{}", headers={"authorization": f"bearer {key}"})
        assert answer.json() == {"ok": True, "body": "{}"}
    assert app.get("/health").status_code == 200
    assert app.get("/v1/control/state").status_code == 200  # the control API checks its own token


def test_an_api_key_middleware_without_a_key_is_refused():
    with pytest.raises(ValueError):
        ApiKeyMiddleware(None, " , ")
