"""What the gateway reads from a client's request before routing it: the body (capped in size and
time), the fields routing and the record need (stream, prompt length, session, model, tags) and
the request id. Bad input raises `OpenAIError` (400, 408, 413), answered in OpenAI's error shape.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable

import orjson
from pydantic import TypeAdapter, ValidationError
from starlette.requests import ClientDisconnect, Request

from specwatch.common.bodies import TooLarge, read_capped
from specwatch.common.http import OpenAIError, incoming_request_id
from specwatch.telemetry.schema import GATEWAY_TAG, MAX_TAGS, TagKey, TagValue

TAGS = TypeAdapter(dict[TagKey, TagValue])


async def read_body(request: Request, limit: int, timeout_s: float = 30.0) -> bytes:
    """The whole body, at most `limit` bytes (413), within `timeout_s` (408: a client trickling its
    body would hold a connection forever)."""
    declared = request.headers.get("content-length")
    if declared and declared.isdecimal() and int(declared) > limit:
        raise OpenAIError(413, f"request body of {declared} bytes is over the gateway's limit of {limit} bytes")
    try:
        async with asyncio.timeout(timeout_s):
            return await read_capped(request.stream(), limit)
    except TooLarge:
        raise OpenAIError(413, f"request body is over the gateway's limit of {limit} bytes") from None
    except ClientDisconnect:
        raise OpenAIError(400, "the client went away before sending the whole body") from None
    except TimeoutError:
        raise OpenAIError(408, f"the request body did not arrive within {timeout_s:g} s") from None


def json_object(raw: bytes) -> dict:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise OpenAIError(400, f"request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise OpenAIError(400, "request body must be a JSON object")
    return body


def request_id(request: Request) -> str:
    """The client's own `x-request-id` (validated, 400 when malformed), else a fresh one."""
    return incoming_request_id(request) or uuid.uuid4().hex


def stream_flag(body: dict) -> bool:
    stream = body.get("stream", False)
    if stream is not None and not isinstance(stream, bool):
        raise OpenAIError(400, "stream: must be true or false", param="stream")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise OpenAIError(400, "stream_options: must be an object", param="stream_options")
    return bool(stream)


def choices_requested(body: dict) -> int:
    """The choices asked for (`n`, 1 when absent); the upstream answers a bad one, so it is not refused here."""
    n = body.get("n")
    return n if type(n) is int and n > 1 else 1


def client_wants_usage(body: dict) -> bool:
    return bool((body.get("stream_options") or {}).get("include_usage"))


def prompt_tokens(body: dict, count_tokens: Callable[[str], int] | None) -> int:
    """The prompt's length in tokens: the tokenizer's count, or 4 characters per token without one."""
    text = prompt_text(body)
    return count_tokens(text) if count_tokens else (len(text) + 3) // 4


def prompt_text(body: dict) -> str:
    messages = body.get("messages")
    if isinstance(messages, list):
        return "\n".join(text for message in messages for text in _message_texts(message))
    prompt = body.get("prompt", body.get("text"))  # `text`: SGLang's native /generate
    if isinstance(prompt, list):
        return "\n".join(p for p in prompt if isinstance(p, str))
    return prompt if isinstance(prompt, str) else ""


def _message_texts(message) -> list[str]:
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return [content]
    if isinstance(content, list):  # content parts: the text ones count
        return [p["text"] for p in content if isinstance(p, dict) and isinstance(p.get("text"), str)]
    return []


def capture_prompt(body: dict) -> tuple[list[dict], str]:
    """The prompt as a capture keeps it (telemetry.capture): the chat messages' roles and texts, or a
    completion's text as one user turn; and the capture's kind."""
    messages = body.get("messages")
    if isinstance(messages, list):
        turns = [
            {"role": str(m.get("role")), "content": "\n".join(_message_texts(m))}
            for m in messages
            if isinstance(m, dict)
        ]
        return turns, "chat"
    return [{"role": "user", "content": prompt_text(body)}], "completion"


def answer_text(body: dict) -> str:
    """A whole OpenAI answer's generated text: the first choice's message content, or its text."""
    choices = body.get("choices")
    choice = choices[0] if isinstance(choices, list) and choices and isinstance(choices[0], dict) else {}
    message = choice.get("message")
    text = message.get("content") if isinstance(message, dict) else choice.get("text", body.get("text"))
    return text if isinstance(text, str) else ""


def session(request: Request, body: dict) -> str | None:
    user = body.get("user")
    return request.headers.get("x-specwatch-session") or (user if isinstance(user, str) and user else None)


def model_label(body: dict) -> str:
    model = body.get("model")
    if isinstance(model, str) and 0 < len(model) <= 128 and "\x00" not in model:
        return model
    return "unknown"


def tags(request: Request, body: dict) -> dict[str, str]:
    """Tags from the body (`extra_body={"tags": ...}`) and the `x-specwatch-tags` header
    (a JSON object or `k=v,k=v`; the header wins), with the telemetry contract's limits."""
    found = body.get("tags") or {}
    if not isinstance(found, dict):
        raise OpenAIError(400, "tags: must be an object of string values", param="tags")
    if header := request.headers.get("x-specwatch-tags"):
        found = {**found, **_header_tags(header)}
    try:
        found = TAGS.validate_python(found)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = "".join(f".{p}" for p in first["loc"])
        limits = "keys 1-64, values <= 128 characters, no NUL"
        raise OpenAIError(400, f"tags{where}: {first['msg']} ({limits})", param="tags") from None
    if len(found) - (GATEWAY_TAG in found) >= MAX_TAGS:  # the gateway adds its own (gateway.records)
        raise OpenAIError(400, f"tags: at most {MAX_TAGS - 1} tags (the gateway adds {GATEWAY_TAG}=NAME)", param="tags")
    return found


def _header_tags(header: str) -> dict:
    if header.lstrip().startswith("{"):
        try:
            found = orjson.loads(header)
        except orjson.JSONDecodeError:
            found = None
        if not isinstance(found, dict):
            raise OpenAIError(400, "x-specwatch-tags: not a JSON object")
        return found
    pairs = [item.partition("=") for item in header.split(",") if item.strip()]
    if any(not sep for _, sep, _ in pairs):
        raise OpenAIError(400, "x-specwatch-tags: expected KEY=VALUE[,KEY=VALUE] or a JSON object")
    return {key.strip(): value.strip() for key, _, value in pairs}
