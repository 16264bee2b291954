"""The proxied OpenAI routes: route a request to an upstream, relay its answer, record the outcome.

Streaming responses are relayed event by event as they arrive (never buffered whole). For a
streamed request the gateway asks the upstream for the final usage chunk, which carries vLLM's
per-request metrics (`stream_options.include_usage`), and drops that chunk again when the
client did not ask for it. A client that leaves mid-stream closes the upstream connection,
which aborts the request there. Upstream errors (4xx/5xx) reach the client unchanged. A request's
failure (a timeout, a broken answer) never marks its upstream down, a refused connection aside:
health checks decide (gateway.core.Gateway.check).

The upstream gets the request's id as `x-request-id` (the client's own when it sent a valid one)
and the gateway's arrival time as `x-specwatch-started-at`: our engine records the request under
both, so its record and the gateway's are one row at the collector (docs/gateway.md). With spans on
(docs/otlp.md, "Spans out") it gets the `traceparent` of the gateway's span for the request, so the
engine's span is its child; else the client's, unchanged.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

import aiohttp
import orjson
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from specwatch.common.bodies import TooLarge
from specwatch.common.http import (
    INSTANCE_HEADER,
    REQUEST_ID_HEADER,
    STARTED_AT_HEADER,
    arrived,
    openai_error,
    reported_instance,
)
from specwatch.gateway import parsing
from specwatch.gateway.core import Gateway
from specwatch.gateway.records import Outcome, SseReader
from specwatch.gateway.upstreams import UpstreamState
from specwatch.gateway.whole import WholeReader

# The client's headers every upstream gets; its Authorization only an upstream started with `auth=forward`
# (a client's key is for the gateway's operator, not for every server behind it: docs/security.md).
FORWARDED_HEADERS = ("traceparent", "tracestate", "content-type", "accept")
JSON_BODY = {"content-type": "application/json"}  # the body is a JSON object (checked); the client's type wins

# Nothing reached the upstream: the next one may take the request. A refused connection marks it down.
NOT_REACHED = (aiohttp.ClientConnectorError, aiohttp.ConnectionTimeoutError)
# An upstream failing while it answers (or before): a broken connection, a malformed answer, a read timeout.
UPSTREAM_FAILED = (aiohttp.ClientError, asyncio.TimeoutError)


async def proxy(request: Request) -> Response:
    gateway: Gateway = request.app.state.gateway
    t0 = arrived(request)  # the record's TTFT and e2e run from here, as the client's clock does
    started_at = time.time() - (time.monotonic() - t0)
    raw = await parsing.read_body(request, gateway.settings.max_body_bytes, gateway.settings.body_timeout_s)
    body = parsing.json_object(raw)
    stream = parsing.stream_flag(body)
    # SGLang's native /generate has no stream_options: its chunks carry meta_info
    drop_usage = stream and request.url.path.startswith("/v1/") and not parsing.client_wants_usage(body)
    if drop_usage:  # the final usage chunk carries the per-request metrics: ask for it
        body["stream_options"] = {**(body.get("stream_options") or {}), "include_usage": True}
        raw = orjson.dumps(body)
    outcome = _admit(gateway, request, body, started_at)
    sent = await _send(gateway, request, raw, outcome, t0, _forwarded(gateway, request, body, outcome))
    if isinstance(sent, Response):
        return sent
    response, state = sent
    if response.status >= 400 or not stream:
        return await _whole(gateway, response, state, outcome, t0)
    reader = SseReader(drop_usage_chunk=drop_usage, collect_text=outcome.capture is not None)
    relay = _relay(gateway, response.content.iter_any(), response, state, outcome, reader, t0)
    return StreamingResponse(relay, status_code=response.status, headers=_headers(response, state, outcome))


def _admit(gateway: Gateway, request: Request, body: dict, started_at: float) -> Outcome:
    """The request's outcome so far: its id, its pool's routing decision, what the record needs of its body."""
    prompt_tokens = parsing.prompt_tokens(body, gateway.settings.count_tokens)
    spec_load = gateway.pool_load("spec")  # inf when no spec upstream is healthy
    route = gateway.router.decide(prompt_tokens, parsing.session(request, body), spec_load != float("inf"), spec_load)
    rid, tags = parsing.request_id(request), parsing.tags(request, body)
    return Outcome(
        request_id=rid,
        started_at=started_at,
        model=parsing.model_label(body),
        prompt_tokens_estimate=prompt_tokens,
        tags=tags,
        mode_reason=route.reason,
        arm=route.arm,
        load_at_admission=None,
        pool=route.pool,
        n=parsing.choices_requested(body),
        streamed=parsing.stream_flag(body),
        capture=parsing.capture_prompt(body) if gateway.sink.wants_capture(rid, tags, prompt_tokens) else None,
    )


def _forwarded(gateway: Gateway, request: Request, body: dict, outcome: Outcome) -> dict[str, str]:
    """The client's headers an upstream gets. With spans on (telemetry.spans) the request's span begins
    here, a child of the client's `traceparent`, and the upstream gets this span's traceparent instead."""
    headers = JSON_BODY | {k: v for k in FORWARDED_HEADERS if (v := request.headers.get(k))}
    return headers | gateway.sink.begin_span(outcome.request_id, request.headers, request.url.path, body)


async def _send(gateway: Gateway, request: Request, raw: bytes, outcome: Outcome, t0: float, headers: dict):
    """(response, upstream) from the first upstream that answers; failover to the other pool
    when this one has none left. A Response (503, 502, 504) when none could answer. `headers`: the
    client's headers it forwards (`_forwarded`)."""
    tried: set[str] = set()
    headers = headers | {REQUEST_ID_HEADER: outcome.request_id, STARTED_AT_HEADER: repr(outcome.started_at)}
    authorization = {"authorization": v} if (v := request.headers.get("authorization")) else {}
    while (state := _next_upstream(gateway, outcome, tried)) is not None:
        url = state.upstream.url + request.url.path
        sent = headers | authorization if state.upstream.forward_auth else headers
        try:
            return await _send_once(gateway.session, url, raw, sent, outcome), state
        except NOT_REACHED as exc:  # nothing reached it: try the next one
            _not_reached(state, outcome, exc)  # down only when refused: a slow accept is no dead upstream
        except UPSTREAM_FAILED as exc:  # it took the request and failed before answering
            return _failed_before_answering(gateway, state, outcome, exc, t0)
    return _no_upstream(gateway, outcome, tried, t0)


def _next_upstream(gateway: Gateway, outcome: Outcome, tried: set[str]) -> UpstreamState | None:
    """The next upstream to try, from the routed pool, else the other one ('failover'); taken for the request."""
    state = gateway.pick(outcome.pool, tried)
    if state is None:
        outcome.pool = "plain" if outcome.pool == "spec" else "spec"
        if (state := gateway.pick(outcome.pool, tried)) is None:
            return None
        outcome.mode_reason, outcome.arm = "failover", None
    tried.add(state.upstream.name)
    outcome.instance, outcome.drafter = state.upstream.name, state.upstream.drafter
    outcome.engine_version = gateway.markers.version(state.upstream.name)  # gates its per-request metrics
    outcome.load_at_admission = state.load
    state.in_flight += 1
    outcome.shared_from = state.sharing.enter()
    return state


def _not_reached(state: UpstreamState, outcome: Outcome, exc: Exception) -> None:
    state.in_flight -= 1
    state.sharing.leave(outcome.shared_from)  # nothing reached it: no share of its time
    outcome.shared_from = None
    if isinstance(exc, aiohttp.ClientConnectorError):
        state.mark_down(f"connect: {type(exc).__name__}: {exc}"[:200])
    outcome.retries += 1


def _failed_before_answering(
    gateway: Gateway, state: UpstreamState, outcome: Outcome, exc: Exception, t0: float
) -> Response:
    timed_out = isinstance(exc, asyncio.TimeoutError)
    outcome.status, outcome.error = "error", "upstream:timeout" if timed_out else "upstream:no_response"
    gateway.finish(outcome, t0, state)
    message = f"upstream {state.upstream.name} failed before answering: {type(exc).__name__}"
    return openai_error(504 if timed_out else 502, message)


async def _send_once(
    session: aiohttp.ClientSession, url: str, raw: bytes, headers: dict, outcome: Outcome
) -> aiohttp.ClientResponse:
    """The upstream's answer, once its headers are in (the body is read by the caller). A kept-alive
    connection that the upstream closed while idle fails before any answer: one more try, on a fresh
    connection, before the upstream is taken for broken."""
    try:
        response = await session.post(url, data=raw, headers=headers)
    except NOT_REACHED:
        raise
    except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
        outcome.retries += 1
        response = await session.post(url, data=raw, headers=headers)
    outcome.reported_instance = reported_instance(response.headers.get(INSTANCE_HEADER))
    return response


def _no_upstream(gateway: Gateway, outcome: Outcome, tried: set[str], t0: float) -> Response:
    outcome.instance, outcome.drafter, outcome.status = outcome.instance or gateway.settings.name, None, "error"
    outcome.error = "gateway:no_upstream"
    gateway.finish(outcome, t0, None)
    down = ", ".join(f"{s.upstream.name} ({s.last_error or 'down'})" for s in gateway.states.values())
    return openai_error(503, f"no upstream can take the request; tried {sorted(tried)}; {down}")


async def _whole(gateway: Gateway, response: aiohttp.ClientResponse, state: UpstreamState, outcome: Outcome, t0: float):
    """A whole (non-streamed, or refused) answer. Up to `whole_response_bytes`: read, checked (502 when it
    is no JSON object), noted and passed on unchanged. Larger: relayed as it arrives (gateway.whole)."""
    name, settings = state.upstream.name, gateway.settings
    declared, chunks = response.headers.get("content-length", ""), response.content.iter_any()
    try:
        if declared.isdecimal() and int(declared) > settings.max_response_bytes:
            raise TooLarge
        content, complete = await _read_head(chunks, settings.whole_response_bytes)
    except TooLarge:
        response.close()
        message = f"upstream {name} sent a body over {settings.max_response_bytes} bytes"
        return _refuse(gateway, state, outcome, t0, "too_large", message)
    except UPSTREAM_FAILED:
        response.close()
        return _refuse(gateway, state, outcome, t0, "disconnected", f"upstream {name} broke off its response")
    if response.status >= 400:
        outcome.status, outcome.error = "error", f"upstream:{response.status}"
    if complete:
        response.release()
        return _checked(gateway, response, content, state, outcome, t0)
    reader = WholeReader(settings.max_response_bytes)
    relay = _relay(gateway, _after(content, chunks), response, state, outcome, reader, t0)
    return StreamingResponse(relay, status_code=response.status, headers=_headers(response, state, outcome))


def _checked(
    gateway: Gateway,
    response: aiohttp.ClientResponse,
    content: bytes,
    state: UpstreamState,
    outcome: Outcome,
    t0: float,
) -> Response:
    """An answer read whole: a success must be a JSON object (else 502), its usage and metrics noted."""
    if response.status < 400:
        if not isinstance(body := _json_or_none(content), dict):
            message = f"upstream {state.upstream.name} returned a malformed body (not a JSON object)"
            return _refuse(gateway, state, outcome, t0, "malformed", message)
        outcome.usage, outcome.metrics = body.get("usage"), body.get("metrics")
        outcome.meta_info = body.get("meta_info")  # SGLang's per-request counts (gateway.sglang)
        outcome.timings = body.get("timings")  # llama.cpp's (gateway.llamacpp)
        if outcome.capture is not None:
            outcome.output_text = parsing.answer_text(body)
    gateway.finish(outcome, t0, state)
    return Response(content, response.status, headers=_headers(response, state, outcome))


async def _read_head(chunks: AsyncIterator[bytes], hold: int) -> tuple[bytes, bool]:
    """The first chunks up to just past `hold` bytes, and whether that was all of them."""
    parts, size = [], 0
    async for chunk in chunks:
        parts.append(chunk)
        size += len(chunk)
        if size > hold:
            return b"".join(parts), False
    return b"".join(parts), True


async def _after(head: bytes, chunks: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
    yield head
    async for chunk in chunks:
        yield chunk


def _json_or_none(content: bytes):
    try:
        return orjson.loads(content)
    except orjson.JSONDecodeError:
        return None


def _refuse(gateway: Gateway, state: UpstreamState, outcome: Outcome, t0: float, kind: str, message: str) -> Response:
    """502 for an upstream answer the gateway cannot pass on; recorded as `upstream:<kind>`."""
    outcome.status, outcome.error = "error", f"upstream:{kind}"
    gateway.finish(outcome, t0, state)
    return openai_error(502, message)


async def _relay(
    gateway: Gateway,
    chunks: AsyncIterator[bytes],
    response: aiohttp.ClientResponse,
    state: UpstreamState,
    outcome: Outcome,
    reader: SseReader | WholeReader,
    t0: float,
) -> AsyncIterator[bytes]:
    """The answer's bytes as they arrive, through `reader` (SSE events, or a whole answer's chunks).

    A stream whose `[DONE]` was passed on is finished, whatever the client does next (it may close before
    the upstream's connection ends); one cut before it is cancelled, with the tokens it delivered."""
    finished = done_sent = False
    try:
        async for data in chunks:  # decoded, what is there (events that came together pass as one write)
            out = reader.feed(data)
            first = outcome.ttft_s is None and reader.saw_content
            if out:
                yield out
                done_sent = reader.done
            if first:  # after the yield: the transport took the first content chunk, the client's TTFT ends
                outcome.ttft_s = time.monotonic() - t0
        if rest := reader.rest():
            yield rest
        if outcome.status == "ok":
            reader.note(outcome)
        finished = True
    except (*UPSTREAM_FAILED, TooLarge) as exc:  # the upstream went away mid-answer, or sent too much
        too_large = isinstance(exc, TooLarge)
        outcome.status, finished = "error", True
        outcome.error = "upstream:too_large" if too_large else "upstream:disconnected"
        what = f"sent over {gateway.settings.max_response_bytes} bytes" if too_large else "broke off the stream"
        message = f"upstream {state.upstream.name} {what} ({type(exc).__name__})"
        if (said := reader.broken(message)) is None:
            raise  # a whole answer cut short: the connection is aborted, the client's body left incomplete
        yield said
    finally:
        if not finished and done_sent and outcome.status == "ok":  # the client left after the end it was sent
            reader.note(outcome)
        elif not finished:  # the client left (cancelled or closed): closing the connection aborts it upstream
            outcome.status, outcome.error = "cancelled", "client:disconnected"
            outcome.usage, outcome.metrics = reader.delivered_usage(), reader.metrics
            outcome.meta_info = reader.meta_info
        if finished and outcome.status == "ok":
            response.release()  # read to its end: the connection goes back to the pool
        else:
            response.close()  # closing the connection aborts the request upstream
        gateway.finish(outcome, t0, state)


def _headers(response: aiohttp.ClientResponse, state: UpstreamState, outcome: Outcome) -> dict[str, str]:
    headers = {"x-specwatch-upstream": state.upstream.name, "x-specwatch-request-id": outcome.request_id}
    if content_type := response.headers.get("content-type"):
        headers["content-type"] = content_type
    return headers
