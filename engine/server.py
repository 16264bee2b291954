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
prompt that does not fit the context has code `context_length_exceeded`.

A request's `x-request-id` header (a gateway's, or a client's idempotency key) becomes its record's
`request_id`, and with it `x-specwatch-started-at` the record's `started_at`, so that a gateway's record
and this engine's of one request are one row at the collector (docs/gateway.md). With spans on
(docs/otlp.md, "Spans out") each request that runs gets a span, a child of its `traceparent`.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
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
    ControlGuard,
    OpenAIError,
    error_body,
    incoming_request_id,
    incoming_started_at,
    openai_error,
)
from specwatch.engine import control, markers
from specwatch.engine.cuda import NoCudaStreams
from specwatch.engine.engine import SEED_RANGE, GenerateRequest, GenerateResult, RequestError
from specwatch.engine.metrics import EngineMetrics
from specwatch.engine.openai_metrics import vllm_metrics
from specwatch.engine.sampling import SamplingParams
from specwatch.engine.scheduler import Overloaded, Scheduler, ShuttingDown, Ticket
from specwatch.telemetry.schema import MAX_TAGS, RequestRecord, TagKey, TagValue


class _Common(BaseModel):
    # strict: `"yes"` is no boolean and `"20"` no count (the gateway and the telemetry contract agree)
    model_config = ConfigDict(extra="ignore", strict=True)

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1, le=32_768)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=-1, le=2**31 - 1)  # 0 or -1 (vLLM's spelling): no truncation
    n: int = Field(default=1, ge=1, le=1)
    stream: bool = False
    stream_options: dict | None = None  # the final chunk carries usage whatever it says (as the gateway reads)
    stop: str | list[str] | None = Field(default=None, max_length=4)
    seed: int | None = Field(default=None, ge=SEED_RANGE[0], le=SEED_RANGE[1])
    user: str | None = None
    gamma: int = Field(default=8, ge=0, le=64)
    drafter: str | None = Field(default="ngram", max_length=256)
    # the telemetry contract's own tag types: a tag its RequestRecord would refuse is refused here, up front
    tags: dict[TagKey, TagValue] = Field(default_factory=dict, max_length=MAX_TAGS)
    # not supported: refused (400) when asked for, rather than silently answered without them
    logprobs: bool | int | None = None
    top_logprobs: int | None = None

    def unsupported(self) -> str | None:
        """The first parameter asked for that this engine does not support, else None."""
        return next((name for name in ("logprobs", "top_logprobs") if getattr(self, name) not in (None, False)), None)

    def generate_request(self, drafters: Mapping[str, str], identity: RequestIdentity, **content) -> GenerateRequest:
        """`drafters`: the server's registered drafter names and their specs."""
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        return GenerateRequest(
            **content,
            max_tokens=self.max_tokens or 16,
            drafter=request_drafter(self.drafter, drafters),
            gamma=self.gamma,
            sampling=SamplingParams(temperature=self.temperature, top_p=self.top_p, top_k=max(self.top_k, 0)),
            stop=stop,
            seed=self.seed,
            tags=self.tags,
            request_id=identity.request_id,
            started_at=identity.started_at,
        )


class CompletionBody(_Common):
    prompt: str | list[str]


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True)

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str


class ChatBody(_Common):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=32_768)


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


BUILTIN_DRAFTERS = ("none", "ngram", "suffix", "early-exit:K", "auto")


@dataclass(frozen=True)
class RequestIdentity:
    """The record's `request_id` and `started_at`: a gateway's (its `x-request-id` and
    `x-specwatch-started-at`), so the gateway's record and the engine's are one row at the collector;
    else a fresh id and the engine's own clock (started_at None)."""

    request_id: str
    started_at: float | None = None

    @classmethod
    def of(cls, request: Request) -> RequestIdentity:
        """400 (OpenAIError) for a malformed header; a started-at without an id is not adopted."""
        request_id = incoming_request_id(request)
        if request_id is None:
            return cls(uuid.uuid4().hex)
        return cls(request_id, incoming_started_at(request, time.time()))


def request_drafter(name: str | None, drafters: Mapping[str, str]) -> str | None:
    """The drafter spec for a request's `drafter`: a built-in one, or a name the server registered.

    Never a path from the request (`model:PATH`): a caller could probe the host's files or load any model."""
    if name in (None, "none"):
        return None
    if name in ("ngram", "suffix", "auto") or (
        name.startswith("early-exit:") and name[len("early-exit:") :].isdecimal()
    ):
        return name
    if name in drafters:
        return drafters[name]
    allowed = ", ".join([*BUILTIN_DRAFTERS, *drafters])
    raise RequestError(f"unknown drafter {name[:64]!r}: use one of {allowed}", "drafter")


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

    @app.exception_handler(RequestValidationError)
    async def bad_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        first = exc.errors()[0] if exc.errors() else {}
        if first.get("type") == "json_invalid":  # its loc is a character offset, not a parameter
            return openai_error(400, f"request body is not valid JSON: {first.get('msg')}", code="json_invalid")
        loc = [str(part) for part in first.get("loc", ())][1:]  # after 'body'
        message = f"{'.'.join(loc) or 'request body'}: {first.get('msg', 'invalid request')}"
        return openai_error(400, message, param=loc[0] if loc else None, code=first.get("type"))

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


async def _completions(body: CompletionBody, request: Request) -> Response:
    prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
    if len(prompts) != 1:
        return openai_error(400, "prompt: exactly one prompt per request is supported", param="prompt")
    return await _serve(request, body, {"prompt": prompts[0]}, chat=False)


async def _chat_completions(body: ChatBody, request: Request) -> Response:
    if body.max_completion_tokens and not body.max_tokens:
        body.max_tokens = body.max_completion_tokens
    return await _serve(request, body, {"messages": [m.model_dump() for m in body.messages]}, chat=True)


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


async def _serve(request: Request, body: _Common, content: dict, chat: bool) -> Response:
    scheduler: Scheduler = request.app.state.scheduler
    if body.model and body.model != request.app.state.model_name:
        return openai_error(
            404,
            f"model {body.model!r} does not exist; this server serves {request.app.state.model_name!r}",
        )
    if unsupported := body.unsupported():
        return openai_error(400, f"{unsupported}: not supported by this engine", param=unsupported)
    if "drafter" not in body.model_fields_set:  # the server's default: 'none' makes a plain upstream for a gateway
        body.drafter = request.app.state.default_drafter
    identity = RequestIdentity.of(request)
    scheduler.sink.begin_span(identity.request_id, request.headers, request.url.path, dict(body))
    try:
        generate = body.generate_request(request.app.state.drafters, identity, **content)
        scheduler.engine.check_drafter(generate.drafter)
        ticket = scheduler.submit(generate, asyncio.get_running_loop())
    except ValueError as exc:
        scheduler.sink.drop_span(identity.request_id)  # refused before it ran: no record ends its span
        return openai_error(400, str(exc), param=getattr(exc, "param", None), code=getattr(exc, "code", None))
    except Overloaded as exc:
        scheduler.sink.drop_span(identity.request_id)  # refused before it ran: no record ends its span
        return openai_error(429, str(exc), headers={"Retry-After": str(exc.retry_after_s)})
    frame = _Frame(request.app.state.model_name, chat, len(ticket.prompt_ids))
    named = {INSTANCE_HEADER: scheduler.engine.config.instance}  # a gateway in front records it under this too
    if body.stream:
        return StreamingResponse(_sse(ticket, frame), media_type="text/event-stream", headers=named)
    found = await _whole(ticket, frame, request)
    found.headers.update(named)
    return found


async def _events(ticket: Ticket) -> AsyncIterator[str | GenerateResult]:
    """Deltas then the result; a client that goes away cancels the request."""
    try:
        while True:
            item = await ticket.events.get()
            if isinstance(item, Exception):
                raise item
            if isinstance(item, GenerateResult) and item.finish_reason == "error":
                raise RuntimeError(item.record.error or "generation failed")
            yield item
            if isinstance(item, GenerateResult):
                return
    finally:
        ticket.cancelled.set()  # no-op once finished; frees the slot if the client left


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
                yield _data(frame.chunk(item, None, None))
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

    def __init__(self, model: str, chat: bool, prompt_tokens: int) -> None:
        self.id = f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"
        self.model, self.chat, self.prompt_tokens, self.created = model, chat, prompt_tokens, int(time.time())
        self.first = True

    def _envelope(self, kind: str) -> dict:
        return {"id": self.id, "object": kind, "created": self.created, "model": self.model}

    def chunk(self, text: str, finish: str | None, result: GenerateResult | None) -> dict:
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
        out = result.record.output_tokens
        usage = {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": out,
            "total_tokens": self.prompt_tokens + out,
        }
        return {"usage": usage, "metrics": vllm_metrics(result.record)}


def _finish(reason: str | None) -> str | None:
    """OpenAI's finish_reason; a request cancelled before it finished is vLLM's 'abort'."""
    return {"cancelled": "abort"}.get(reason, reason)
