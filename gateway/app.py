"""The gateway's ASGI app: the OpenAI routes proxied to an upstream (gateway.proxy), the control API
(gateway.control), /v1/models, health and /metrics. Refusals are OpenAI-shaped (common.http)."""

from __future__ import annotations

import asyncio
import contextlib
from contextlib import asynccontextmanager

import aiohttp
import httpx
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from specwatch.common.http import ERROR_HANDLERS, ApiKeyMiddleware, ArrivalStamp, openai_error
from specwatch.gateway import control
from specwatch.gateway.core import Gateway
from specwatch.gateway.proxy import proxy

# An idle upstream connection is dropped after this: under uvicorn's 5 s keep-alive (vLLM's, our engine's),
# so the gateway rarely sends on a connection the upstream is closing (gateway.proxy retries that once).
UPSTREAM_IDLE_S = 4.0


def create_app(gateway: Gateway) -> Starlette:
    routes = [
        Route("/v1/chat/completions", proxy, methods=["POST"]),
        Route("/v1/completions", proxy, methods=["POST"]),
        Route("/generate", proxy, methods=["POST"]),  # SGLang's native API (meta_info: gateway.sglang)
        Route("/v1/models", _models, methods=["GET"]),
        Route("/health", _health, methods=["GET"]),
        Route("/metrics", _metrics, methods=["GET"]),
        *control.ROUTES,
    ]
    app = Starlette(routes=routes, lifespan=_lifespan, exception_handlers=ERROR_HANDLERS)
    if gateway.settings.api_key:
        app.add_middleware(ApiKeyMiddleware, keys=gateway.settings.api_key)
    app.add_middleware(ArrivalStamp)  # added last: outermost, so the stamp precedes the key check
    app.state.gateway = gateway
    return app


@asynccontextmanager
async def _lifespan(app: Starlette):
    """The upstreams' HTTP clients, a first health check, the watcher; the sink's client flushed at the end."""
    gateway: Gateway = app.state.gateway
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=1024)
    timeout = httpx.Timeout(gateway.settings.upstream_timeout_s, connect=gateway.settings.connect_timeout_s)
    # trust_env off (both clients): upstreams are addressed directly, never through an HTTP(S)_PROXY
    async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False) as http, _session(gateway) as session:
        gateway.http, gateway.session = http, session
        gateway.sink.emit("config", {"role": "gateway", "routing": gateway.router.state["config"]})
        await asyncio.gather(*(gateway.check(state) for state in gateway.states.values()))
        gateway.emit_upstreams()
        watcher = asyncio.create_task(gateway.watch_health())
        try:
            yield
        finally:
            watcher.cancel()
            if gateway.sink.client is not None:
                await asyncio.to_thread(gateway.sink.client.flush, 5.0)
            await asyncio.to_thread(gateway.sink.close_spans)


def _session(gateway: Gateway) -> aiohttp.ClientSession:
    """The proxied requests' client (gateway.core says why aiohttp). No cookie jar: a cookie one upstream
    answer sets must never ride along on another client's request. `sock_read`: the longest wait for an
    upstream's next bytes, as httpx's read timeout; no total: a long generation is no timeout."""
    settings = gateway.settings
    timeout = aiohttp.ClientTimeout(
        total=None, sock_connect=settings.connect_timeout_s, sock_read=settings.upstream_timeout_s
    )
    connector = aiohttp.TCPConnector(limit=0, keepalive_timeout=UPSTREAM_IDLE_S)
    return aiohttp.ClientSession(
        connector=connector, timeout=timeout, cookie_jar=aiohttp.DummyCookieJar(), skip_auto_headers=("User-Agent",)
    )


async def _models(request: Request) -> Response:
    gateway: Gateway = request.app.state.gateway
    authorization = {"authorization": v} if (v := request.headers.get("authorization")) else {}
    for state in sorted(gateway.states.values(), key=lambda s: not s.healthy):
        headers = authorization if state.upstream.forward_auth else {}  # as proxied requests (docs/security.md)
        with contextlib.suppress(httpx.HTTPError):
            response = await gateway.http.get(f"{state.upstream.url}/v1/models", timeout=5.0, headers=headers)
            if response.status_code == 200:
                return Response(response.content, 200, media_type="application/json")
    return openai_error(503, "no upstream answered /v1/models")


async def _health(request: Request) -> Response:
    gateway: Gateway = request.app.state.gateway
    up = [s.upstream.name for s in gateway.states.values() if s.healthy]
    body = {"status": "ok" if up else "no upstream", "healthy": up}
    return JSONResponse(body, status_code=200 if up else 503)


async def _metrics(request: Request) -> Response:
    return Response(generate_latest(request.app.state.gateway.registry), media_type=CONTENT_TYPE_LATEST)
