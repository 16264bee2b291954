"""The gateway's control API (what alerts' remediation calls): set the routing mode, read the state.

Every route needs the admin bearer token (`--control-token`; off without one). Actions on a device
(defragment, draft models, streams) are the engine's: the gateway answers 409.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from common.http import OpenAIError
from gateway.core import Gateway
from gateway.parsing import json_object, read_body

MODES = ("auto", "speculative", "autoregressive")
REASONS = ("manual", "alert")


def _guarded(request: Request) -> Gateway:
    """The gateway, once the request has shown the control token (else 401/403 raised)."""
    gateway: Gateway = request.app.state.gateway
    gateway.guard(request)
    return gateway


async def set_mode(request: Request) -> Response:
    gateway = _guarded(request)
    body = json_object(await read_body(request, 4096))
    mode, reason = body.get("mode"), body.get("reason", "manual")
    if mode not in MODES:
        raise OpenAIError(400, f"mode: must be one of {', '.join(MODES)}", param="mode")
    if reason not in REASONS:
        raise OpenAIError(400, f"reason: must be one of {', '.join(REASONS)}", param="reason")
    gateway.router.set_override(mode, reason)
    return _state_of(gateway)


async def state(request: Request) -> Response:
    return _state_of(_guarded(request))


def _state_of(gateway: Gateway) -> JSONResponse:
    upstreams = [s.describe() for s in gateway.states.values()]
    return JSONResponse({**gateway.router.state, "upstreams": upstreams})


async def not_applicable(request: Request) -> Response:
    _guarded(request)
    action = request.path_params["action"]
    raise OpenAIError(409, f"{action}: not applicable to a gateway (it has no device or draft model of its own)")


ROUTES = [
    Route("/v1/control/mode", set_mode, methods=["POST"]),
    Route("/v1/control/state", state, methods=["GET"]),
    Route("/v1/control/{action:path}", not_applicable, methods=["POST"]),
]
