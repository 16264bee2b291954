"""The gateway's ASGI app: the OpenAI routes proxied to an upstream, the control API, health and /metrics.

Streaming responses are relayed event by event as they arrive (never buffered whole). For a
streamed request the gateway asks the upstream for the final usage chunk, which carries vLLM's
per-request metrics (`stream_options.include_usage`), and drops that chunk again when the
client did not ask for it. A client that leaves mid-stream closes the upstream connection,
which aborts the request there. Upstream errors (4xx/5xx) reach the client unchanged.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import anyio
import httpx
import orjson
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import TypeAdapter, ValidationError
from starlette.applications import Starlette
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from common.auth import Grant, TokenTable
from common.bodies import TooLarge, read_capped
from gateway.metrics import GatewayMetrics
from gateway.records import Outcome, SseReader
from gateway.routing import Router
from gateway.upstreams import Upstream, UpstreamState
from telemetry.client import TelemetryClient
from telemetry.schema import MAX_TAGS, EngineEvent, RequestRecord, TagKey, TagValue

FORWARDED_HEADERS = ("authorization", "traceparent", "tracestate", "content-type", "accept")
TAGS = TypeAdapter(dict[TagKey, TagValue])
MODES = ("auto", "speculative", "autoregressive")
MAX_REPORTED_UPSTREAMS = 16
SLOW_CHECKS_DOWN = (
    3  # health checks timing out in a row before an upstream counts as down  # an event's detail holds at most 4 KiB
)


@dataclass(frozen=True)
class GatewaySettings:
    name: str = "gateway"  # the instance of records for requests no upstream took
    max_body_bytes: int = 4 * 1024 * 1024
    body_timeout_s: float = 30.0  # the whole request body must arrive within this
    max_response_bytes: int = 64 * 1024 * 1024  # a whole (non-streamed) upstream answer, held to be read
    upstream_timeout_s: float = 600.0  # longest wait for an upstream's next bytes
    connect_timeout_s: float = 2.0
    health_interval_s: float = 1.0
    control_token: str | None = None
    count_tokens: Callable[[str], int] | None = None  # a tokenizer; None: estimate 4 characters per token


class HttpError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.kind = status, kind


def error_response(status: int, message: str, kind: str = "invalid_request_error", headers=None) -> JSONResponse:
    body = {"error": {"message": message, "type": kind, "param": None, "code": None}}
    return JSONResponse(body, status_code=status, headers=headers)


class Gateway:
    def __init__(
        self,
        upstreams: list[Upstream],
        router: Router,
        settings: GatewaySettings,
        telemetry: TelemetryClient | None = None,
    ) -> None:
        self.states = {u.name: UpstreamState(u) for u in upstreams}
        self.router, self.settings, self.telemetry = router, settings, telemetry
        self.tokens = TokenTable({settings.control_token: Grant("admin")}) if settings.control_token else None
        self.registry = CollectorRegistry()
        self.metrics = GatewayMetrics(self.states, self.registry)
        self.http: httpx.AsyncClient | None = None
        self.listeners: list[Callable[[RequestRecord], None]] = []  # called with every finished request's record

    # -- upstream selection --------------------------------------------------------------------

    def pool(self, name: str) -> list[UpstreamState]:
        return [s for s in self.states.values() if s.upstream.pool == name]

    def pool_load(self, name: str) -> float:
        """The healthy part of a pool: its least-loaded upstream's load (where the next request goes)."""
        loads = [s.load for s in self.pool(name) if s.healthy]
        return min(loads) if loads else float("inf")

    def pick(self, pool: str, exclude: set[str]) -> UpstreamState | None:
        """The healthy upstream of `pool` with the lowest load, not yet tried for this request."""
        candidates = [s for s in self.pool(pool) if s.healthy and s.upstream.name not in exclude]
        return min(candidates, key=lambda s: s.load, default=None)

    # -- health ----------------------------------------------------------------------------------

    async def watch_health(self) -> None:
        while True:
            await asyncio.sleep(self.settings.health_interval_s)
            await self.check_all()

    async def check_all(self) -> None:
        """Health-check and scrape every upstream; an 'upstream' event when any health changed."""
        before = [s.healthy for s in self.states.values()]
        await asyncio.gather(*(self.check(state) for state in self.states.values()))
        if before != [s.healthy for s in self.states.values()]:
            self.emit_upstreams()

    def emit(self, kind: str, detail: dict) -> None:
        if self.telemetry is not None:
            self.telemetry.submit_event(
                EngineEvent(instance=self.settings.name, at=time.time(), kind=kind, detail=detail)
            )

    def emit_upstreams(self) -> None:
        """The health of every upstream, one snapshot per event (the dashboard's Sources page reads the last)."""
        upstreams = [
            {
                "name": s.upstream.name,
                "url": s.upstream.url[:120],
                "pool": s.upstream.pool,
                "drafter": s.upstream.drafter,
                "healthy": s.healthy,
                "reason": None if s.healthy else (s.last_error or "down")[:80],
            }
            for s in list(self.states.values())[:MAX_REPORTED_UPSTREAMS]
        ]
        self.emit("upstream", {"role": "gateway", "upstreams": upstreams})

    async def check(self, state: UpstreamState) -> None:
        timeout = max(1.0, min(2.0, self.settings.health_interval_s * 2))
        try:
            health = await self.http.get(f"{state.upstream.url}/health", timeout=timeout)
            if health.status_code != 200:
                state.mark_down(f"health check: /health answered {health.status_code}")
            else:
                metrics = await self.http.get(f"{state.upstream.url}/metrics", timeout=timeout)
                if metrics.status_code == 200:
                    state.read_metrics(metrics.text)
                state.mark_up()
            state.slow_checks = 0
        except httpx.TimeoutException as exc:  # alive but slow (a starved CPU server): down after a few in a row
            state.slow_checks += 1
            if state.slow_checks >= SLOW_CHECKS_DOWN:
                state.mark_down(f"health check: {state.slow_checks} timeouts in a row ({type(exc).__name__})")
        except httpx.HTTPError as exc:
            state.mark_down(f"health check: {type(exc).__name__}: {exc}"[:200])
        state.checked_at = time.time()

    # -- bookkeeping -------------------------------------------------------------------------------

    def finish(self, outcome: Outcome, t0: float, state: UpstreamState | None) -> RequestRecord:
        outcome.e2e_s = time.monotonic() - t0
        if state is not None:
            state.in_flight -= 1
            outcome.device_s = state.sharing.leave(outcome.shared_from)
            state.served[outcome.status] = state.served.get(outcome.status, 0) + 1
        record = outcome.record()
        self.router.observe(record)
        self.metrics.observe(record, outcome.e2e_s)
        if self.telemetry is not None:
            self.telemetry.submit_request(record)
        for listener in self.listeners:
            listener(record)
        return record


def create_app(gateway: Gateway) -> Starlette:
    @asynccontextmanager
    async def lifespan(app: Starlette):
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=1024)
        timeout = httpx.Timeout(gateway.settings.upstream_timeout_s, connect=gateway.settings.connect_timeout_s)
        # trust_env off: upstreams are addressed directly, never through an HTTP(S)_PROXY meant for the outside
        async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as http:
            gateway.http = http
            gateway.emit("config", {"role": "gateway", "routing": gateway.router.state["config"]})
            await asyncio.gather(*(gateway.check(state) for state in gateway.states.values()))
            gateway.emit_upstreams()
            watcher = asyncio.create_task(gateway.watch_health())
            try:
                yield
            finally:
                watcher.cancel()
                if gateway.telemetry is not None:
                    await asyncio.to_thread(gateway.telemetry.flush, 5.0)

    routes = [
        Route("/v1/chat/completions", _proxy, methods=["POST"]),
        Route("/v1/completions", _proxy, methods=["POST"]),
        Route("/v1/models", _models, methods=["GET"]),
        Route("/health", _health, methods=["GET"]),
        Route("/metrics", _metrics, methods=["GET"]),
        Route("/v1/control/mode", _set_mode, methods=["POST"]),
        Route("/v1/control/state", _state, methods=["GET"]),
        Route("/v1/control/{action:path}", _not_applicable, methods=["POST"]),
    ]
    handlers = {HttpError: _http_error, StarletteHTTPException: _starlette_error}
    app = Starlette(routes=routes, lifespan=lifespan, exception_handlers=handlers)
    app.state.gateway = gateway
    return app


async def _http_error(request: Request, exc: HttpError) -> JSONResponse:
    return error_response(exc.status, str(exc), exc.kind)


async def _starlette_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    """Unknown routes (404) and wrong methods (405) in OpenAI's error shape too."""
    message = f"{request.method} {request.url.path}: {exc.detail}"
    return error_response(
        exc.status_code, message, "not_found_error" if exc.status_code == 404 else "invalid_request_error", exc.headers
    )


# -- the proxied routes -----------------------------------------------------------------------------


async def _proxy(request: Request) -> Response:
    gateway: Gateway = request.app.state.gateway
    t0, started_at = time.monotonic(), time.time()
    raw = await _read_body(request, gateway.settings.max_body_bytes, gateway.settings.body_timeout_s)
    body = _json_object(raw)
    stream = _stream_flag(body)
    drop_usage = stream and not _client_wants_usage(body)
    if drop_usage:  # the final usage chunk carries the per-request metrics: ask for it
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        raw = orjson.dumps(body)
    prompt_tokens = _prompt_tokens(body, gateway.settings.count_tokens)
    spec_load = gateway.pool_load("spec")  # inf when no spec upstream is healthy
    route = gateway.router.decide(prompt_tokens, _session(request, body), spec_load != float("inf"), spec_load)
    outcome = Outcome(
        request_id=uuid.uuid4().hex,
        started_at=started_at,
        model=_model_label(body),
        prompt_tokens_estimate=prompt_tokens,
        tags=_tags(request, body),
        mode_reason=route.reason,
        arm=route.arm,
        load_at_admission=None,
    )
    sent = await _send(gateway, request, raw, route.pool, outcome, t0)
    if isinstance(sent, Response):
        return sent
    response, state = sent
    if response.status_code >= 400 or not stream:
        return await _whole(gateway, response, state, outcome, t0)
    reader = SseReader(drop_usage_chunk=drop_usage)
    return StreamingResponse(
        _relay(gateway, response, state, outcome, reader, t0),
        status_code=response.status_code,
        headers=_response_headers(response, state, outcome),
    )


async def _send(gateway: Gateway, request: Request, raw: bytes, pool: str, outcome: Outcome, t0: float):
    """(response, upstream) from the first upstream that answers; failover to the other pool
    when this one has none left. A Response (503, 502, 504) when none could answer."""
    tried: set[str] = set()
    headers = {k: v for k in FORWARDED_HEADERS if (v := request.headers.get(k))}
    headers["x-request-id"] = outcome.request_id
    while True:
        state = gateway.pick(pool, tried)
        if state is None:
            pool = "plain" if pool == "spec" else "spec"
            state = gateway.pick(pool, tried)
            if state is None:
                return _no_upstream(gateway, outcome, tried, t0)
            outcome.mode_reason, outcome.arm = "failover", None
        tried.add(state.upstream.name)
        outcome.instance, outcome.drafter = state.upstream.name, state.upstream.drafter
        outcome.load_at_admission = state.load
        state.in_flight += 1
        outcome.shared_from = state.sharing.enter()
        upstream_request = gateway.http.build_request(
            "POST", state.upstream.url + request.url.path, content=raw, headers=headers
        )
        try:
            return await _send_once(gateway, upstream_request, outcome), state
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:  # nothing reached it: try the next one
            state.in_flight -= 1
            state.sharing.leave(outcome.shared_from)  # nothing reached it: no share of its time
            outcome.shared_from = None
            state.mark_down(f"connect: {type(exc).__name__}: {exc}"[:200])
            outcome.retries += 1
        except httpx.HTTPError as exc:  # it took the request and failed before answering
            state.mark_down(f"request: {type(exc).__name__}: {exc}"[:200])
            timed_out = isinstance(exc, httpx.TimeoutException)
            outcome.status, outcome.error = "error", "upstream:timeout" if timed_out else "upstream:no_response"
            gateway.finish(outcome, t0, state)
            message = f"upstream {state.upstream.name} failed before answering: {type(exc).__name__}"
            return error_response(504 if timed_out else 502, message, "server_error")


async def _send_once(gateway: Gateway, upstream_request: httpx.Request, outcome: Outcome) -> httpx.Response:
    """A kept-alive connection that the upstream closed while idle fails before any answer:
    one more try, on a fresh connection, before the upstream is taken for broken."""
    try:
        return await gateway.http.send(upstream_request, stream=True)
    except (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError):
        outcome.retries += 1
        return await gateway.http.send(upstream_request, stream=True)


def _no_upstream(gateway: Gateway, outcome: Outcome, tried: set[str], t0: float) -> Response:
    outcome.instance, outcome.drafter, outcome.status = outcome.instance or gateway.settings.name, None, "error"
    outcome.error = "gateway:no_upstream"
    gateway.finish(outcome, t0, None)
    down = ", ".join(f"{s.upstream.name} ({s.last_error or 'down'})" for s in gateway.states.values())
    return error_response(503, f"no upstream can take the request; tried {sorted(tried)}; {down}", "server_error")


async def _whole(gateway: Gateway, response: httpx.Response, state: UpstreamState, outcome: Outcome, t0: float):
    try:
        content = await read_capped(response.aiter_bytes(), gateway.settings.max_response_bytes)
    except TooLarge:
        outcome.status, outcome.error = "error", "upstream:too_large"
        gateway.finish(outcome, t0, state)
        limit = gateway.settings.max_response_bytes
        return error_response(502, f"upstream {state.upstream.name} sent a body over {limit} bytes", "server_error")
    except httpx.HTTPError as exc:
        state.mark_down(f"read: {type(exc).__name__}")
        outcome.status, outcome.error = "error", "upstream:disconnected"
        gateway.finish(outcome, t0, state)
        return error_response(502, f"upstream {state.upstream.name} broke off its response", "server_error")
    finally:
        await response.aclose()
    if response.status_code >= 400:
        outcome.status, outcome.error = "error", f"upstream:{response.status_code}"
    else:
        try:
            body = orjson.loads(content)
            if not isinstance(body, dict):
                raise ValueError("not a JSON object")
        except ValueError:
            outcome.status, outcome.error = "error", "upstream:malformed"
            gateway.finish(outcome, t0, state)
            return error_response(
                502, f"upstream {state.upstream.name} returned a malformed body (not a JSON object)", "server_error"
            )
        outcome.usage, outcome.metrics = body.get("usage"), body.get("metrics")
    gateway.finish(outcome, t0, state)
    return Response(content, response.status_code, headers=_response_headers(response, state, outcome))


async def _relay(
    gateway: Gateway, response: httpx.Response, state: UpstreamState, outcome: Outcome, reader: SseReader, t0: float
) -> AsyncIterator[bytes]:
    finished = False
    try:
        async for data in response.aiter_bytes():  # decoded: the client gets no content-encoding header
            out = reader.feed(data)
            if outcome.ttft_s is None and reader.saw_content:
                outcome.ttft_s = time.monotonic() - t0
            if out:
                yield out
        if rest := reader.rest():
            yield rest
        if reader.error or reader.malformed or not reader.done:
            outcome.status = "error"
            outcome.error = "upstream:stream_error" if reader.error else "upstream:malformed_stream"
        outcome.usage, outcome.metrics = reader.usage, reader.metrics
        finished = True
    except httpx.HTTPError as exc:  # the upstream went away mid-stream: say so in-band, as OpenAI does
        state.mark_down(f"stream: {type(exc).__name__}")
        outcome.status, outcome.error, finished = "error", "upstream:disconnected", True
        message = f"upstream {state.upstream.name} broke off the stream ({type(exc).__name__})"
        yield b"data: " + orjson.dumps({"error": {"message": message, "type": "server_error"}}) + b"\n\n"
        yield b"data: [DONE]\n\n"
    finally:
        if not finished:  # the client left (cancelled or closed): closing the connection aborts it upstream
            outcome.status, outcome.error = "cancelled", "client:disconnected"
            outcome.usage, outcome.metrics = reader.usage, reader.metrics
        with anyio.CancelScope(shield=True):
            await response.aclose()
        gateway.finish(outcome, t0, state)


# -- request parsing ----------------------------------------------------------------------------------


async def _read_body(request: Request, limit: int, timeout_s: float = 30.0) -> bytes:
    """The whole body, at most `limit` bytes (413), within `timeout_s` (408: a client trickling its
    body would hold a connection forever)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdecimal() and int(declared) > limit:
        raise HttpError(413, f"request body of {declared} bytes is over the gateway's limit of {limit} bytes")
    try:
        async with asyncio.timeout(timeout_s):
            return await read_capped(request.stream(), limit)
    except TooLarge:
        raise HttpError(413, f"request body is over the gateway's limit of {limit} bytes") from None
    except ClientDisconnect:
        raise HttpError(400, "the client went away before sending the whole body") from None
    except TimeoutError:
        raise HttpError(408, f"the request body did not arrive within {timeout_s:g} s") from None


def _json_object(raw: bytes) -> dict:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise HttpError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise HttpError(400, "request body must be a JSON object")
    return body


def _stream_flag(body: dict) -> bool:
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise HttpError(400, "stream: must be true or false")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise HttpError(400, "stream_options: must be an object")
    return bool(stream)


def _client_wants_usage(body: dict) -> bool:
    return bool((body.get("stream_options") or {}).get("include_usage"))


def _prompt_tokens(body: dict, count_tokens: Callable[[str], int] | None) -> int:
    """The prompt's length in tokens: the tokenizer's count, or 4 characters per token without one."""
    text = _prompt_text(body)
    return count_tokens(text) if count_tokens else (len(text) + 3) // 4


def _prompt_text(body: dict) -> str:
    messages = body.get("messages")
    if isinstance(messages, list):
        parts = []
        for message in messages:
            content = message.get("content") if isinstance(message, dict) else None
            if isinstance(content, str):
                parts.append(content)
            elif isinstance(content, list):  # content parts: the text ones count
                parts += [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
        return "\n".join(parts)
    prompt = body.get("prompt")
    if isinstance(prompt, list):
        return "\n".join(p for p in prompt if isinstance(p, str))
    return prompt if isinstance(prompt, str) else ""


def _session(request: Request, body: dict) -> str | None:
    user = body.get("user")
    return request.headers.get("x-specwatch-session") or (user if isinstance(user, str) and user else None)


def _model_label(body: dict) -> str:
    model = body.get("model")
    if isinstance(model, str) and 0 < len(model) <= 128 and "\x00" not in model:
        return model
    return "unknown"


def _tags(request: Request, body: dict) -> dict[str, str]:
    """Tags from the body (`extra_body={"tags": ...}`) and the `x-specwatch-tags` header
    (a JSON object or `k=v,k=v`; the header wins), with the telemetry contract's limits."""
    tags = body.get("tags") or {}
    if not isinstance(tags, dict):
        raise HttpError(400, "tags: must be an object of string values")
    header = request.headers.get("x-specwatch-tags")
    if header:
        tags = {**tags, **_header_tags(header)}
    try:
        tags = TAGS.validate_python(tags)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise HttpError(
            400, f"tags{'.' + where if where else ''}: {first['msg']} (keys 1-64, values <= 128 characters, no NUL)"
        ) from None
    if len(tags) > MAX_TAGS:
        raise HttpError(400, f"tags: at most {MAX_TAGS} tags")
    return tags


def _header_tags(header: str) -> dict:
    if header.lstrip().startswith("{"):
        try:
            tags = orjson.loads(header)
        except orjson.JSONDecodeError:
            raise HttpError(400, "x-specwatch-tags: not a JSON object") from None
        if not isinstance(tags, dict):
            raise HttpError(400, "x-specwatch-tags: not a JSON object")
        return tags
    pairs = [item.partition("=") for item in header.split(",") if item.strip()]
    if any(not sep for _, sep, _ in pairs):
        raise HttpError(400, "x-specwatch-tags: expected KEY=VALUE[,KEY=VALUE] or a JSON object")
    return {key.strip(): value.strip() for key, _, value in pairs}


def _response_headers(response: httpx.Response, state: UpstreamState, outcome: Outcome) -> dict[str, str]:
    headers = {"x-specwatch-upstream": state.upstream.name, "x-specwatch-request-id": outcome.request_id}
    if content_type := response.headers.get("content-type"):
        headers["content-type"] = content_type
    return headers


# -- the other routes --------------------------------------------------------------------------------


async def _models(request: Request) -> Response:
    gateway: Gateway = request.app.state.gateway
    for state in sorted(gateway.states.values(), key=lambda s: not s.healthy):
        with contextlib.suppress(httpx.HTTPError):
            response = await gateway.http.get(f"{state.upstream.url}/v1/models", timeout=5.0)
            if response.status_code == 200:
                return Response(response.content, 200, media_type="application/json")
    return error_response(503, "no upstream answered /v1/models", "server_error")


async def _health(request: Request) -> Response:
    gateway: Gateway = request.app.state.gateway
    up = [s.upstream.name for s in gateway.states.values() if s.healthy]
    body = {"status": "ok" if up else "no upstream", "healthy": up}
    return JSONResponse(body, status_code=200 if up else 503)


async def _metrics(request: Request) -> Response:
    return Response(generate_latest(request.app.state.gateway.registry), media_type=CONTENT_TYPE_LATEST)


def _control_allowed(request: Request) -> Response | None:
    tokens = request.app.state.gateway.tokens
    if tokens is None:
        return error_response(403, "the control API is off: start the gateway with --control-token", "permission_error")
    if tokens.grant(request.headers.get("authorization")) is None:
        return error_response(
            401,
            "missing or wrong bearer token for the control API",
            "authentication_error",
            {"WWW-Authenticate": "Bearer"},
        )
    return None


async def _set_mode(request: Request) -> Response:
    if refused := _control_allowed(request):
        return refused
    body = _json_object(await _read_body(request, 4096))
    mode, reason = body.get("mode"), body.get("reason", "manual")
    if mode not in MODES:
        raise HttpError(400, f"mode: must be one of {', '.join(MODES)}")
    if reason not in ("manual", "alert"):
        raise HttpError(400, "reason: must be manual or alert")
    request.app.state.gateway.router.set_override(mode, reason)
    return await _state(request)


async def _state(request: Request) -> Response:
    if refused := _control_allowed(request):
        return refused
    gateway: Gateway = request.app.state.gateway
    upstreams = [s.describe() for s in gateway.states.values()]
    return JSONResponse({**gateway.router.state, "upstreams": upstreams})


async def _not_applicable(request: Request) -> Response:
    if refused := _control_allowed(request):
        return refused
    action = request.path_params["action"]
    return error_response(409, f"{action}: not applicable to a gateway (it has no device or draft model of its own)")
