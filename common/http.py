"""The HTTP edges the engine's server and the gateway share: OpenAI's error body, the control API's
bearer-token guard, the OpenAI routes' API key, the `x-request-id` a request may bring with it, and the
moment a request arrived (`ArrivalStamp`), from which its TTFT and e2e are measured.

Every refusal is `{"error": {"message", "type", "param", "code"}}` (OpenAI's shape), its `type`
following the status unless given: 401 authentication_error, 403 permission_error,
404 not_found_error, 429 rate_limit_error, 5xx server_error, else invalid_request_error.
"""

from __future__ import annotations

import re
import time
from collections.abc import Mapping

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from specwatch.common.auth import Grant, TokenTable, listed_tokens

ERROR_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error", 429: "rate_limit_error"}
REQUEST_ID_HEADER = "x-request-id"
MAX_REQUEST_ID = 128  # the telemetry contract's longest name
REQUEST_ID = re.compile(rf"[\x21-\x7e]{{1,{MAX_REQUEST_ID}}}")  # printable ASCII, no spaces


def error_type(status: int) -> str:
    return "server_error" if status >= 500 else ERROR_TYPES.get(status, "invalid_request_error")


def error_body(message: str, kind: str = "server_error", param: str | None = None, code: str | None = None) -> dict:
    """OpenAI's error object (also what a stream reports in-band once its headers are sent)."""
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def openai_error(
    status: int,
    message: str,
    kind: str | None = None,
    headers: Mapping[str, str] | None = None,
    param: str | None = None,
    code: str | None = None,
) -> JSONResponse:
    """The response refusing a request: OpenAI's error body, `kind` by status unless given."""
    body = error_body(message, kind or error_type(status), param, code)
    return JSONResponse(body, status_code=status, headers=dict(headers) if headers else None)


class OpenAIError(Exception):
    """Raised in a handler (or a dependency) to refuse the request; `openai_error_handler` answers it."""

    def __init__(self, status: int, message: str, kind: str | None = None, **fields) -> None:
        super().__init__(message)
        self.status, self.kind = status, kind
        self.param, self.code, self.headers = fields.get("param"), fields.get("code"), fields.get("headers")

    def response(self) -> JSONResponse:
        return openai_error(self.status, str(self), self.kind, self.headers, self.param, self.code)


async def openai_error_handler(request: Request, exc: OpenAIError) -> JSONResponse:
    return exc.response()


async def http_exception_handler(request: Request, exc: HTTPException) -> JSONResponse:
    """The framework's own refusals (unknown route 404, wrong method 405, unparsable body) in OpenAI's shape."""
    return openai_error(exc.status_code, f"{request.method} {request.url.path}: {exc.detail}", headers=exc.headers)


ERROR_HANDLERS = {OpenAIError: openai_error_handler, HTTPException: http_exception_handler}


class ControlGuard:
    """The /v1/control API's check: off without a token (403 saying how to turn it on), else the
    request must carry `Authorization: Bearer <token>` (401). A FastAPI dependency as it stands."""

    def __init__(self, token: str | None, server: str) -> None:
        self.tokens = TokenTable({token: Grant("admin")}) if token else None  # one token, commas and all
        self.server = server  # who to start with the token: 'engine' | 'gateway'

    def __call__(self, request: Request) -> None:
        if self.tokens is None:
            how = "--control-token (or SPECWATCH_CONTROL_TOKEN)"
            raise OpenAIError(403, f"the control API is off: start the {self.server} with {how}")
        if self.tokens.grant(request.headers.get("authorization")) is None:
            raise _unauthorized("missing or wrong bearer token for the control API")


class ApiKeyMiddleware:
    """The OpenAI routes' API key (`--api-key`, SPECWATCH_API_KEY; several comma-separated for rotation):
    every `/v1/...` request but the control API's (its own token) must carry `Authorization: Bearer <key>`,
    else 401 in OpenAI's shape (`code: invalid_api_key`), answered before its body is read.
    /health, /healthz and /metrics stay open (probes, Prometheus). Pure ASGI: streams pass untouched."""

    def __init__(self, app: ASGIApp, keys: str) -> None:
        self.app, self.tokens = app, _key_table(keys)
        if self.tokens is None:
            raise ValueError("an API key middleware needs at least one key")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and _needs_key(scope["path"]) and not self._allows(scope):
            message = "missing or wrong API key: send 'Authorization: Bearer <key>'"
            await _unauthorized(message, "invalid_api_key").response()(scope, receive, send)
            return
        await self.app(scope, receive, send)

    def _allows(self, scope: Scope) -> bool:
        return self.tokens.grant(Headers(scope=scope).get("authorization")) is not None


class ArrivalStamp:
    """Stamps `scope["state"]["arrived"]` (time.monotonic) when the server hands the request to the app,
    as soon as its headers are read: before its body is read and parsed, so a record's TTFT and e2e
    count that time too, as the client's clock does. Outermost middleware; pure ASGI, so it costs one
    clock read and streams pass untouched."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            scope.setdefault("state", {})["arrived"] = time.monotonic()
        await self.app(scope, receive, send)


def arrived(request: Request) -> float:
    """When `request` arrived (ArrivalStamp's stamp; now, for an app served without the stamp)."""
    return request.scope.get("state", {}).get("arrived") or time.monotonic()


def _needs_key(path: str) -> bool:
    return path.startswith("/v1/") and not path.startswith("/v1/control/")


def _key_table(keys: str | None) -> TokenTable | None:
    """Bearer keys compared in constant time (common.auth); None when `keys` lists none."""
    listed = listed_tokens(keys)
    return TokenTable(dict.fromkeys(listed, Grant("admin"))) if listed else None


def _unauthorized(message: str, code: str | None = None) -> OpenAIError:
    return OpenAIError(401, message, code=code, headers={"WWW-Authenticate": "Bearer"})


def incoming_request_id(request: Request) -> str | None:
    """The request's own `x-request-id` (a gateway's, or a client's idempotency key), else None.
    At most 128 printable ASCII characters without spaces; anything else is refused (400)."""
    value = request.headers.get(REQUEST_ID_HEADER)
    if value is None:
        return None
    if not REQUEST_ID.fullmatch(value):
        raise OpenAIError(
            400,
            f"{REQUEST_ID_HEADER}: must be 1-{MAX_REQUEST_ID} printable ASCII characters without spaces",
            param=REQUEST_ID_HEADER,
        )
    return value


STARTED_AT_HEADER = "x-specwatch-started-at"
# the engine's own instance name on its answers: a gateway in front records the request under it too, so
# the engine's record and the gateway's name one instance whichever reaches the collector first
INSTANCE_HEADER = "x-specwatch-instance"


def reported_instance(value: str | None) -> str | None:
    """An upstream's `x-specwatch-instance`, when it is a valid name (as a request id is), else None."""
    return value if value is not None and REQUEST_ID.fullmatch(value) else None


MAX_CLOCK_SKEW_S = 300.0


def incoming_started_at(request: Request, now: float) -> float | None:
    """When a gateway says the request arrived there (epoch s), so that the engine's record carries
    the same `started_at` as the gateway's (the collector's PostgreSQL key is request_id and
    started_at). None without the header, or when it is over `MAX_CLOCK_SKEW_S` from `now` (a
    skewed clock: the engine keeps its own); anything but a number is refused (400)."""
    value = request.headers.get(STARTED_AT_HEADER)
    if value is None:
        return None
    try:
        started_at = float(value)
    except ValueError:
        started_at = float("nan")
    if started_at != started_at or abs(started_at) == float("inf"):
        raise OpenAIError(400, f"{STARTED_AT_HEADER}: must be epoch seconds", param=STARTED_AT_HEADER)
    return started_at if abs(started_at - now) <= MAX_CLOCK_SKEW_S else None
