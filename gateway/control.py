"""The gateway's control API (what alerts' remediation and `specwatch tune canary` call): set the
routing mode, set the live canary share, read the state.

`POST /v1/control/canary {"share": S, "reason": "..."}`: S in [0, 1] is the share of traffic for the
spec pool (the candidate; arm 'spec'), the rest going to the plain pool (today's config; arm
'control'); 1.0 promotes the candidate, 0.0 rolls back, null ends the split. The change is a
`mode_switch` event (detail: role, canary share before and after, reason).

Every route needs the admin bearer token (`--control-token`; off without one). Actions on a device
(defragment, draft models, streams) are the engine's: the gateway answers 409.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from specwatch.common.http import OpenAIError
from specwatch.gateway.core import Gateway
from specwatch.gateway.parsing import json_object, read_body

MODES = ("auto", "speculative", "autoregressive")
REASONS = ("manual", "alert")
CANARY_KEYS = {"share", "reason"}
MAX_REASON_CHARS = 200


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


async def set_canary(request: Request) -> Response:
    gateway = _guarded(request)
    body = json_object(await read_body(request, 4096))
    if unknown := sorted(set(body) - CANARY_KEYS):
        raise OpenAIError(400, f"unknown field(s): {', '.join(unknown)} (expected share, reason)", param=unknown[0])
    if "share" not in body:
        raise OpenAIError(400, "share: required (a number from 0 to 1, or null to end the split)", param="share")
    share, reason = _share(body["share"]), body.get("reason", "manual")
    if not isinstance(reason, str) or not 0 < len(reason) <= MAX_REASON_CHARS:
        raise OpenAIError(400, f"reason: a string of 1 to {MAX_REASON_CHARS} characters", param="reason")
    previous = gateway.router.set_canary(share)
    gateway.sink.emit("mode_switch", {"role": "gateway", "canary": {"from": previous, "to": share}, "reason": reason})
    return _state_of(gateway)


def _share(value) -> float | None:
    """A share in [0, 1] (bools, strings and non-finite numbers refused), or None."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= 1.0:
        raise OpenAIError(400, f"share: must be a number from 0 to 1 or null, not {value!r}"[:200], param="share")
    return float(value)


async def state(request: Request) -> Response:
    return _state_of(_guarded(request))


def _state_of(gateway: Gateway) -> JSONResponse:
    upstreams = [s.describe() for s in gateway.states.values()]
    return JSONResponse({"name": gateway.settings.name, **gateway.router.state, "upstreams": upstreams})


async def not_applicable(request: Request) -> Response:
    _guarded(request)
    action = request.path_params["action"]
    raise OpenAIError(409, f"{action}: not applicable to a gateway (it has no device or draft model of its own)")


ROUTES = [
    Route("/v1/control/mode", set_mode, methods=["POST"]),
    Route("/v1/control/canary", set_canary, methods=["POST"]),
    Route("/v1/control/state", state, methods=["GET"]),
    Route("/v1/control/{action:path}", not_applicable, methods=["POST"]),
]
