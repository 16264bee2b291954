"""Every OpenAI request the engine refuses leaves a trace, whoever sent it (a gateway, or a client
straight to the engine):
- a RequestRecord with status `error` and error `refused:<reason>`, so the refusal is stored and counts in
  the signals' errors like any failed request;
- a count by reason on /metrics: `specwatch_engine_requests_refused_total{reason}` (EngineMetrics).

Reasons (a fixed set, so the label stays bounded): `invalid` (a field out of its type or range, malformed
JSON, a bad header), `unsupported` (a field this engine does not serve: engine/bodies.py's UNSERVED, a content
part that is not text), `context_length` (the prompt does not fit), `model_not_found`, `overloaded` (429).
A request refused for a missing or wrong API key leaves no record (anyone could write them).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping

from fastapi import Request
from fastapi.responses import JSONResponse

from specwatch.common.http import OpenAIError, openai_error
from specwatch.engine.bodies import RequestIdentity
from specwatch.telemetry.schema import RequestRecord

REFUSED = "refused:"  # the record's error: REFUSED + reason
REASONS = ("invalid", "unsupported", "context_length", "model_not_found", "overloaded")
OPENAI_ROUTES = ("/v1/completions", "/v1/chat/completions")


def refuse(
    request: Request,
    status: int,
    message: str,
    reason: str,
    param: str | None = None,
    code: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    """The refusal's response (OpenAI's error shape), after its record went to the engine's sink."""
    scheduler = request.app.state.scheduler
    scheduler.sink.put(refused_record(request, scheduler.engine, reason))
    return openai_error(status, message, headers=headers, param=param, code=code)


def refused_record(request: Request, engine, reason: str) -> RequestRecord:
    """The record of a request refused before it ran: no tokens, no mode it ran in (autoregressive, no
    drafter), e2e from its start (a gateway's `x-specwatch-started-at`, else now) to the refusal."""
    now = time.time()
    try:
        identity = RequestIdentity.of(request)
    except OpenAIError:  # the id header itself was malformed: the refusal still gets a record
        identity = RequestIdentity(uuid.uuid4().hex)
    started_at = identity.started_at if identity.started_at is not None else now
    return RequestRecord(
        request_id=identity.request_id,
        instance=engine.config.instance,
        model=engine.target.name,
        mode="autoregressive",
        started_at=started_at,
        e2e_s=max(now - started_at, 0.0),
        prompt_tokens=0,
        output_tokens=0,
        status="error",
        error=REFUSED + reason,
    )


def reason_of(exc: Exception) -> str:
    """The reason for a request the engine's checks refused (a RequestError or other ValueError)."""
    return "context_length" if getattr(exc, "code", None) == "context_length_exceeded" else "invalid"
