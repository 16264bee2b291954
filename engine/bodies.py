"""The bodies of the OpenAI routes (/v1/completions, /v1/chat/completions) as pydantic models, the
request's identity and the drafter it names: what engine/server.py validates before a request runs.

Every message shape OpenAI's API and SDK send for a text model is served: content as a string or a list of
text parts, `name`, the system, developer, user, assistant and tool roles, `max_completion_tokens`,
`stream_options` (`include_usage`, and vLLM's `continuous_usage_stats`), vLLM's `ignore_eos` and `min_tokens`.
What asks for anything else (images, audio, tools, logprobs, penalties: `UNSERVED`) is refused with a 400
naming the field, never silently ignored.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Annotated, Literal

from fastapi import Request
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field
from pydantic_core import PydanticCustomError

from specwatch.common.http import incoming_request_id, incoming_started_at
from specwatch.engine.engine import SEED_RANGE, GenerateRequest, RequestError
from specwatch.engine.sampling import SamplingParams
from specwatch.telemetry.schema import MAX_TAGS, TagKey, TagValue

# Fields of OpenAI's API (and vLLM's extensions) this engine does not serve, with the values that ask for
# nothing (absent, or the API's default): any other value is refused (400 naming the field), never ignored.
UNSERVED: dict[str, tuple] = {
    "logprobs": (None, False),
    "top_logprobs": (None,),
    "echo": (None, False),
    "suffix": (None,),
    "best_of": (None, 1),
    "logit_bias": (None, {}),
    "presence_penalty": (None, 0),
    "frequency_penalty": (None, 0),
    "repetition_penalty": (None, 1),
    "min_p": (None, 0),
    "response_format": (None, {"type": "text"}),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "functions": (None, []),
    "function_call": (None, "none"),
    "audio": (None,),
    "modalities": (None, ["text"]),
    "prediction": (None,),
    "web_search_options": (None,),
    # on a message: what an assistant turn carries when tools or audio were served
    "tool_calls": (None, []),
}


def unserved(fields: Mapping[str, object]) -> str | None:
    """The first field in `fields` that asks for something this engine does not serve, else None."""
    return next((name for name, value in fields.items() if name in UNSERVED and value not in UNSERVED[name]), None)


class StreamOptions(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    # the final chunk carries usage whatever this says (a gateway reads it there)
    include_usage: bool | None = None
    continuous_usage_stats: bool | None = None  # vLLM's: every chunk carries the usage so far


class OpenAIBody(BaseModel):
    # strict: `"yes"` is no boolean and `"20"` no count (the gateway and the telemetry contract agree);
    # other fields are kept (model_extra) so that `unserved` can refuse the ones that ask for something
    model_config = ConfigDict(extra="allow", strict=True)

    model: str | None = None
    max_tokens: int | None = Field(default=None, ge=1, le=32_768)
    temperature: float = Field(default=1.0, ge=0.0, le=2.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: int = Field(default=0, ge=-1, le=2**31 - 1)  # 0 or -1 (vLLM's spelling): no truncation
    n: int = Field(default=1, ge=1, le=1)
    stream: bool = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = Field(default=None, max_length=4)
    seed: int | None = Field(default=None, ge=SEED_RANGE[0], le=SEED_RANGE[1])
    user: str | None = None
    ignore_eos: bool = False
    min_tokens: int = Field(default=0, ge=0, le=32_768)
    gamma: int = Field(default=8, ge=0, le=64)
    drafter: str | None = Field(default="ngram", max_length=256)
    # the telemetry contract's own tag types: a tag its RequestRecord would refuse is refused here, up front
    tags: dict[TagKey, TagValue] = Field(default_factory=dict, max_length=MAX_TAGS)

    def unsupported(self) -> str | None:
        """The first parameter asked for that this engine does not serve, else None."""
        if self.stream_options is not None and not self.stream:
            return "stream_options"  # OpenAI's rule: only with stream true
        return unserved(self.model_extra or {})

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
            ignore_eos=self.ignore_eos,
            min_tokens=self.min_tokens,
            tags=self.tags,
            request_id=identity.request_id,
            started_at=identity.started_at,
        )

    @property
    def continuous_usage(self) -> bool:
        options = self.stream_options
        return bool(options and options.include_usage and options.continuous_usage_stats)


class CompletionBody(OpenAIBody):
    prompt: str | list[str]


def text_of_parts(content: object) -> object:
    """A message's content given as a list of parts (OpenAI's `[{"type": "text", "text": ...}]`): their
    texts joined by newlines, as vLLM renders them for a text model. A part of any other type (an image,
    audio, a file) is refused, naming its index and type; anything else is left to the field's type."""
    if not isinstance(content, list):
        return content
    texts = []
    for index, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind != "text" or not isinstance(part.get("text"), str):
            raise PydanticCustomError(
                "unsupported_content",
                "part {index} is not a text part ({kind}): this engine serves a text model, only "
                '{{"type": "text", "text": ...}} parts are accepted',
                {"index": index, "kind": f"type {kind!r}" if isinstance(kind, str) else "no text"},
            )
        texts.append(part["text"])
    return "\n".join(texts)


class ChatMessage(BaseModel):
    model_config = ConfigDict(strict=True, extra="allow")  # extras: refused by `unserved` when they ask for something

    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: Annotated[str, BeforeValidator(text_of_parts)]
    name: str | None = Field(default=None, max_length=256)

    def rendered(self) -> dict[str, str]:
        """The message for the chat template: OpenAI's `developer` role is the system role of a model that has
        no developer turn (as OpenAI maps it for older models); `name` stays with the message."""
        message = {"role": "system" if self.role == "developer" else self.role, "content": self.content}
        return message | ({"name": self.name} if self.name is not None else {})


class ChatBody(OpenAIBody):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1, le=32_768)

    def unsupported(self) -> str | None:
        for index, message in enumerate(self.messages):
            if name := unserved(message.model_extra or {}):
                return f"messages.{index}.{name}"
        return super().unsupported()


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
