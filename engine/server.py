"""OpenAI-compatible HTTP API over the scheduler: /v1/completions, /v1/chat/completions
(streaming with server-sent events), /v1/models, plus the control API that alerts use.

specwatch extensions travel in the request body (the OpenAI SDK's `extra_body`):
`gamma`, `top_k`, `drafter` ('none' | 'ngram' | 'suffix' | 'early-exit:K' | 'auto': the policy picks drafter and
gamma per scenario tag | a name registered with `engine serve --drafters NAME=model:PATH`; a request
never names a path) and `tags`.

Each response carries vLLM 0.32's per-request `metrics` object (as with `--enable-per-request-metrics
--per-request-spec-decode-metrics summary`; see engine/openai_metrics.py): time_to_first_token_ms,
generation_time_ms, queue_time_ms, mean_itl_ms, tokens_per_second and `speculative_decoding` (acceptance
histogram and counts; null for a request that did not run speculatively). A whole response has it at the
top level; a stream on its final chunk, the one with `usage`. /health (vLLM's spelling) and /healthz answer alike.

Every refused request is a 400 in OpenAI's error shape (common.http), its `param` naming the field; a
prompt that does not fit the context has code `context_length_exceeded`. What a body may hold is
engine/bodies.py's; each refusal leaves a record and a count on /metrics (engine/refusals.py).

A request's `x-request-id` header (a gateway's, or a client's idempotency key) becomes its record's
`request_id`, and with it `x-specwatch-started-at` the record's `started_at`, so that a gateway's record
and this engine's of one request are one row at the collector (docs/gateway.md). A response's `id` is
`chatcmpl-<request_id>` (`cmpl-` for completions), as vLLM's: a client's log joins the stored rows. With spans on
(docs/otlp.md, "Spans out") each request that runs gets a span, a child of its `traceparent`.

A record's TTFT and e2e run from the request's arrival (its headers read: common.http.ArrivalStamp), as a
client's clock does; a stream's TTFT ends when its first chunk with text is handed to the transport and
its e2e at its final chunk (its record is put once the stream is sent: scheduler.Ticket.hold); a whole
answer's TTFT ends when its first token is decoded. Measured where the engine decodes, it missed the event
loop's delay, which a loaded host makes large.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from typing import Literal

import orjson
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from pydantic import BaseModel, ConfigDict, Field

from specwatch.common.http import (
    ERROR_HANDLERS,
    INSTANCE_HEADER,
    ApiKeyMiddleware,
    ArrivalStamp,
    ControlGuard,
    OpenAIError,
    arrived,
    error_body,
    openai_error,
)
from specwatch.engine import control, markers
from specwatch.engine.bodies import (
    ChatBody,
    CompletionBody,
    OpenAIBody,
    RequestIdentity,
    request_drafter,
)
from specwatch.engine.cuda import NoCudaStreams
from specwatch.engine.engine import Delta, GenerateResult
from specwatch.engine.metrics import EngineMetrics
from specwatch.engine.openai_metrics import vllm_metrics
from specwatch.engine.refusals import OPENAI_ROUTES, reason_of, refuse
from specwatch.engine.scheduler import Overloaded, Scheduler, ShuttingDown, Ticket
from specwatch.telemetry.schema import RequestRecord


class ModeBody(BaseModel):
    mode: Literal["auto", "speculative", "autoregressive"]
    reason: Literal["manual", "alert"] = "manual"
    drafter: str | None = Field(default=None, max_length=256)  # the new default drafter (requests naming none)


class DraftBody(BaseModel):
    action: Literal["unload", "load"]
    drafter: str | None = None


class StreamsBody(BaseModel):
    model_config = ConfigDict(extra="forbid")

    target: Literal["high", "low"] = "high"
    draft: Literal["high", "low"] = "low"


def create_app(
    scheduler: Scheduler,
    model_name: str,
    control_token: str | None = None,
    drafters: Mapping[str, str] | None = None,
    default_drafter: str = "ngram",
    api_key: str | None = None,
) -> FastAPI:
    """`control_token`: bearer token the /v1/control endpoints require (None: the control API is off).
    `drafters`: names a request's `drafter` may give, and their specs (`engine serve --drafters`).
    `default_drafter`: what a request that names none gets (`engine serve --default-drafter`).
    `api_key`: bearer key(s) the /v1 routes require (common.http.ApiKeyMiddleware; None: none).
    Control actions report their EngineEvents, and /metrics its records, through `scheduler.telemetry`."""

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        scheduler.start()
        yield
        scheduler.stop()
        scheduler.sink.close_spans()

    app = FastAPI(title="specwatch engine", lifespan=lifespan, exception_handlers=ERROR_HANDLERS)
    if api_key:
        app.add_middleware(ApiKeyMiddleware, keys=api_key)
    app.add_middleware(ArrivalStamp)  # added last: outermost, so the stamp precedes the key check
    app.state.scheduler, app.state.model_name = scheduler, model_name
    app.state.drafters = dict(drafters or {})
    request_drafter(default_drafter, app.state.drafters)  # a bad default fails at start, not per request
    app.state.default_drafter = default_drafter
    app.state.emit = scheduler.sink.emit
    registry = CollectorRegistry()
    scheduler.sink.subscribe(RequestRecord, EngineMetrics(scheduler, registry).observe)
    app.get("/metrics")(lambda: Response(generate_latest(registry), media_type=CONTENT_TYPE_LATEST))

    control_routes = APIRouter(prefix="/v1/control", dependencies=[Depends(ControlGuard(control_token, "engine"))])
    control_routes.post("/mode")(_set_mode)
    control_routes.get("/state")(_state)
    control_routes.post("/defragment")(_defragment)
    control_routes.post("/draft")(_draft)
    control_routes.post("/streams")(_streams)

    app.exception_handler(RequestValidationError)(_bad_request)

    app.get("/v1/models")(
        lambda: {
            "object": "list",
            "data": [{"id": model_name, "object": "model", "created": 0, "owned_by": "specwatch"}],
        }
    )
    app.get("/healthz")(lambda: {"status": "ok"})
    app.get("/health")(lambda: {"status": "ok"})  # vLLM's spelling, for a gateway that probes both alike
    app.post("/v1/completions")(_completions)
    app.post("/v1/chat/completions")(_chat_completions)
    app.include_router(control_routes)
    return app


async def _bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
    """A body that fails its model: 400 naming the field; on the OpenAI routes a refusal with its trace."""
    first = exc.errors()[0] if exc.errors() else {}
    if first.get("type") == "json_invalid":  # its loc is a character offset, not a parameter
        fields = {"message": f"request body is not valid JSON: {first.get('msg')}", "code": "json_invalid"}
    else:
        loc = [str(part) for part in first.get("loc", ())][1:]  # after 'body'
        message = f"{'.'.join(loc) or 'request body'}: {first.get('msg', 'invalid request')}"
        fields = {"message": message, "param": loc[0] if loc else None, "code": first.get("type")}
    if request.url.path not in OPENAI_ROUTES:
        return openai_error(400, **fields)
    return refuse(
        request, 400, reason="unsupported" if fields["code"] == "unsupported_content" else "invalid", **fields
    )


async def _completions(body: CompletionBody, request: Request) -> Response:
    prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
    if len(prompts) != 1:
        return refuse(request, 400, "prompt: exactly one prompt per request is supported", "unsupported", "prompt")
    return await _serve(request, body, {"prompt": prompts[0]}, chat=False)


async def _chat_completions(body: ChatBody, request: Request) -> Response:
    if body.max_completion_tokens and not body.max_tokens:
        body.max_tokens = body.max_completion_tokens
    return await _serve(request, body, {"messages": [m.rendered() for m in body.messages]}, chat=True)


async def _set_mode(body: ModeBody, request: Request) -> dict:
    state, name = request.app.state, body.drafter or request.app.state.default_drafter
    try:
        spec = request_drafter(name, state.drafters)
        state.scheduler.engine.check_drafter(spec)
    except ValueError as exc:  # RequestError included
        raise OpenAIError(400, str(exc), param="drafter") from None
    changed, state.default_drafter = name != state.default_drafter, name  # a config event marks the change
    identity = markers.identity(state.scheduler.engine, name, state.drafters)
    control.set_mode(state.scheduler, state.emit, body.mode, body.reason, identity, changed)
    return await _state(request)


def _defragment(request: Request) -> dict:
    return control.defragment(request.app.state.scheduler, request.app.state.emit)


def _draft(body: DraftBody, request: Request) -> dict:
    scheduler, emit = request.app.state.scheduler, request.app.state.emit
    if body.action == "unload":
        return control.unload_drafts(scheduler, emit)
    try:
        return control.load_drafts(scheduler, emit, request_drafter(body.drafter, request.app.state.drafters))
    except ValueError as exc:
        raise OpenAIError(400, str(exc), param="drafter") from None


def _streams(body: StreamsBody, request: Request) -> dict:
    try:
        return control.set_streams(request.app.state.scheduler, request.app.state.emit, body.target, body.draft)
    except NoCudaStreams as exc:  # a CPU engine: nothing to change
        raise OpenAIError(409, str(exc)) from None


async def _state(request: Request) -> dict:
    scheduler: Scheduler = request.app.state.scheduler
    return {
        **scheduler.policy.state,
        "load": scheduler.load,
        "active": scheduler.active,
        "queued": scheduler.queue_depth,
        "streams": scheduler.engine.streams.describe(),
    }


async def _serve(request: Request, body: OpenAIBody, content: dict, chat: bool) -> Response:
    scheduler: Scheduler = request.app.state.scheduler
    if body.model and body.model != request.app.state.model_name:
        message = f"model {body.model!r} does not exist; this server serves {request.app.state.model_name!r}"
        return refuse(request, 404, message, "model_not_found")
    if unsupported := body.unsupported():
        message = f"{unsupported}: not supported by this engine"
        if unsupported == "stream_options":
            message = "stream_options: only allowed when stream is true"
        return refuse(request, 400, message, "unsupported", param=unsupported.partition(".")[0])
    if "drafter" not in body.model_fields_set:  # the server's default: 'none' makes a plain upstream for a gateway
        body.drafter = request.app.state.default_drafter
    try:
        identity = RequestIdentity.of(request)
    except OpenAIError as exc:
        return refuse(request, exc.status, str(exc), "invalid", param=exc.param, code=exc.code)
    scheduler.sink.begin_span(identity.request_id, request.headers, request.url.path, dict(body))
    try:
        generate = body.generate_request(request.app.state.drafters, identity, **content)
        scheduler.engine.check_drafter(generate.drafter)
        ticket = scheduler.submit(generate, asyncio.get_running_loop(), arrived(request), body.stream)
    except ValueError as exc:
        scheduler.sink.drop_span(identity.request_id)  # refused before it ran: no record ends its span
        param, code = getattr(exc, "param", None), getattr(exc, "code", None)
        return refuse(request, 400, str(exc), reason_of(exc), param=param, code=code)
    except Overloaded as exc:
        scheduler.sink.drop_span(identity.request_id)  # refused before it ran: no record ends its span
        return refuse(request, 429, str(exc), "overloaded", headers={"Retry-After": str(exc.retry_after_s)})
    ticket.keep = _keeper(scheduler, content, chat)
    model_name, usage = request.app.state.model_name, body.continuous_usage
    frame = _Frame(model_name, chat, len(ticket.prompt_ids), identity.request_id, usage)
    named = {INSTANCE_HEADER: scheduler.engine.config.instance}  # a gateway in front records it under this too
    if body.stream:
        return StreamingResponse(_sse(ticket, frame), media_type="text/event-stream", headers=named)
    found = await _whole(ticket, frame, request)
    found.headers.update(named)
    return found


def _keeper(scheduler: Scheduler, content: dict, chat: bool):
    """What hands a finished request's text to the capture step (telemetry.capture; None: captures are off)."""
    if scheduler.sink.capturer is None:
        return None
    prompt = content["messages"] if chat else [{"role": "user", "content": content["prompt"]}]
    kind = "chat" if chat else "completion"
    return lambda result: scheduler.sink.capture(result.record, prompt, result.text, kind)


async def _events(ticket: Ticket) -> AsyncIterator[Delta | GenerateResult]:
    """Deltas then the result; a client that goes away cancels the request. A finished request's text
    goes to the capture step (`ticket.keep`) when captures are on."""
    try:
        while True:
            item = await ticket.events.get()
            if isinstance(item, Exception):
                raise item
            if isinstance(item, GenerateResult) and item.finish_reason == "error":
                raise RuntimeError(item.record.error or "generation failed")
            if isinstance(item, GenerateResult) and ticket.keep is not None:
                ticket.keep(item)
            if isinstance(item, GenerateResult) and ticket.stream:  # the final chunk's metrics: the server's times
                item = dataclasses.replace(item, record=ticket.settle(item.record))
            yield item
            if isinstance(item, GenerateResult):
                return
    finally:
        ticket.cancelled.set()  # no-op once finished; frees the slot if the client left
        ticket.release()  # a stream's record, held until it was sent, is put now


SHUT_DOWN = "the engine shut down before the request finished"


async def _sse(ticket: Ticket, frame: _Frame) -> AsyncIterator[bytes]:
    """A stream cut short by the shutdown's deadline ends with finish_reason 'abort' (vLLM's) and an
    in-band error, never a 'stop' that would pass for a complete answer."""
    try:
        async for item in _events(ticket):
            if isinstance(item, GenerateResult):
                yield _data(frame.chunk("", item.finish_reason, item))
                if item.finish_reason == "cancelled":
                    yield _data(error_body(SHUT_DOWN, code="engine_shutdown"))
            else:
                yield _data(frame.chunk(item.text, None, None, item.tokens))
                if ticket.first_sent is None:  # resumed once the transport took the chunk: the TTFT ends
                    ticket.sent_first()
    except Exception as exc:  # headers are sent: report in-band, as OpenAI does
        yield _data(error_body(str(exc)))
    yield b"data: [DONE]\n\n"


async def _whole(ticket: Ticket, frame: _Frame, request: Request) -> Response:
    watcher = asyncio.create_task(_cancel_on_disconnect(request, ticket))
    try:
        async for item in _events(ticket):
            if isinstance(item, GenerateResult) and item.finish_reason == "cancelled":  # a shutdown's deadline
                return openai_error(503, SHUT_DOWN)
            if isinstance(item, GenerateResult):
                return JSONResponse(frame.whole(item))
    except ShuttingDown as exc:
        return openai_error(503, str(exc))
    except Exception as exc:
        return openai_error(500, f"generation failed: {exc}")
    finally:
        watcher.cancel()
    return openai_error(500, "generation ended without a result")


async def _cancel_on_disconnect(request: Request, ticket: Ticket) -> None:
    """Cancel the request when its client leaves: the body is read, so the next ASGI message
    is `http.disconnect` (one awaiting task, no polling; the scheduler frees the slot next round)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass
    ticket.cancelled.set()


def _data(payload: dict) -> bytes:
    return b"data: " + orjson.dumps(payload) + b"\n\n"


class _Frame:
    """The OpenAI response envelope for one request."""

    def __init__(
        self, model: str, chat: bool, prompt_tokens: int, request_id: str, continuous_usage: bool = False
    ) -> None:
        # vLLM's shape: the record's request_id in the response's id, so a client's log joins the store's rows
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{request_id}"
        self.model, self.chat, self.prompt_tokens, self.created = model, chat, prompt_tokens, int(time.time())
        self.continuous_usage = continuous_usage  # every chunk carries the usage so far (vLLM's extension)
        self.first = True

    def _envelope(self, kind: str) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def chunk(self, text: str, finish: str | None, result: GenerateResult | None, tokens: int = 0) -> dict:
        """One stream chunk; `tokens`: the output tokens so far, for continuous usage."""
        if self.chat:
            delta = {"role": "assistant", "content": text} if self.first else ({"content": text} if text else {})
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": _finish(finish)}
            payload = {**self._envelope("chat.completion.chunk"), "choices": [choice]}
        else:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": _finish(finish)}
            payload = {**self._envelope("text_completion"), "choices": [choice]}
        self.first = False
        if result is not None:
            payload.update(self._final(result))
        elif self.continuous_usage:
            payload["usage"] = self._usage(tokens)
        return payload

    def whole(self, result: GenerateResult) -> dict:
        finish = _finish(result.finish_reason)
        if self.chat:
            message = {"role": "assistant", "content": result.text}
            choice = {"index": 0, "message": message, "logprobs": None, "finish_reason": finish}
            return {**self._envelope("chat.completion"), "choices": [choice], **self._final(result)}
        choice = {"index": 0, "text": result.text, "logprobs": None, "finish_reason": finish}
        return {**self._envelope("text_completion"), "choices": [choice], **self._final(result)}

    def _final(self, result: GenerateResult) -> dict:
        """What a whole response, or a stream's final chunk, ends with: usage and vLLM's per-request metrics."""
        return {"usage": self._usage(result.record.output_tokens), "metrics": vllm_metrics(result.record)}

    def _usage(self, completion_tokens: int) -> dict:
        total = self.prompt_tokens + completion_tokens
        return {"prompt_tokens": self.prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": total}


def _finish(reason: str | None) -> str | None:
    """OpenAI's finish_reason; a request cancelled before it finished is vLLM's 'abort'."""
    return {"cancelled": "abort"}.get(reason, reason)
