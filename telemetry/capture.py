"""Captures (issue 56): a sample of requests' prompts and outputs, kept to retrain a draft on the traffic
that lost acceptance. Off unless a producer is given a capture policy (`--capture`).

A **capture** is one request's prompt (its chat messages, or a completion's text) and output, with the
request's tenant, tags, drafter and draft counts. The producer (the bundled engine, the gateway) decides,
redacts and caps it before it leaves the process; the collector caps it again (a producer may be
hostile), stores it in its own table (`captures`, never in a request row), deletes it at its
`expires_at` and shows it to the admin role only (docs/security.md, "Captures").

    policy = CapturePolicy.parse("rate=0.1,tenant=acme,below-acceptance=0.6,retention-days=7")
    capturer = Capturer(policy, Redactor.of(["sk-[A-Za-z0-9]{20,}"], "mypkg.redact:scrub"))
    capture = capturer.capture(record, prompt, output, kind="chat")   # None: not sampled

Sampling is by a hash of the request id, so the engine and a gateway in front of it keep the same
requests; the collector keeps one capture per id.
"""

from __future__ import annotations

import hashlib
import importlib
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from specwatch.telemetry.schema import (
    DRAFTER_PATTERN,
    MAX_TAGS,
    NO_NUL,
    DraftTokens,
    Epoch,
    Name,
    RequestRecord,
    TagKey,
    TagValue,
    Tokens,
)

# The most characters of one text (a message, an output) the collector stores whatever a producer sends,
# and the most messages of one prompt: a hostile or huge body is cut to these, never stored whole.
MAX_CAPTURE_CHARS = 32_768
MAX_CAPTURE_MESSAGES = 64
MAX_CAPTURE_BATCH = 256
DAY_S = 86_400.0
REDACTED = "[redacted]"
TRUNCATED = " [truncated]"

CaptureText = Annotated[str, StringConstraints(max_length=MAX_CAPTURE_CHARS, pattern=NO_NUL)]
Role = Literal["system", "user", "assistant", "tool"]
Kind = Literal["chat", "completion"]


class CaptureMessage(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    role: Role
    content: CaptureText


class Capture(BaseModel):
    """One captured request, as it travels to `POST /v1/captures`; `capture_id` is the request's id."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    capture_id: Name
    instance: Name
    model: Name
    drafter: Annotated[str, StringConstraints(pattern=DRAFTER_PATTERN)] | None = None
    kind: Kind
    tags: dict[TagKey, TagValue] = Field(default_factory=dict, max_length=MAX_TAGS)
    started_at: Epoch
    prompt: list[CaptureMessage] = Field(min_length=1, max_length=MAX_CAPTURE_MESSAGES)
    output: CaptureText
    prompt_tokens: Tokens
    output_tokens: Tokens
    num_draft_tokens: DraftTokens = 0
    num_accepted_tokens: Tokens = 0
    truncated: bool = False  # some text was cut at the size cap
    redactions: Annotated[int, Field(ge=0, le=1_000_000)] = 0  # matches the redaction replaced
    expires_at: Epoch  # the retention: the collector deletes it then (or sooner, its own cap)

    @property
    def tenant(self) -> str | None:
        return self.tags.get("tenant")


class CaptureBatch(BaseModel):
    """The body of `POST /v1/captures`."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    captures: list[Capture] = Field(max_length=MAX_CAPTURE_BATCH)


@dataclass(frozen=True)
class CapturePolicy:
    """Which requests a producer captures and how much of each it keeps. `rate` 0 (the default) is off.

    `tenants`/`tags`: only requests of these tenants / with these tag values (empty: any); `below_acceptance`:
    only requests that drafted and accepted less than this share; `prompt_tokens`: only prompts in this
    band (inclusive); `max_chars`: per text kept; `max_total_chars`: all text this process sends, then it
    stops capturing; `retention_s`: how long the collector keeps each capture."""

    rate: float = 0.0
    tenants: frozenset[str] = frozenset()
    tags: tuple[tuple[str, str], ...] = ()
    below_acceptance: float | None = None
    prompt_tokens: tuple[int, int] | None = None
    max_chars: int = 8192
    max_total_chars: int = 64 * 1024 * 1024
    retention_s: float = 7 * DAY_S

    def __post_init__(self) -> None:
        if not 0.0 <= self.rate <= 1.0:
            raise ValueError(f"capture rate must be in [0, 1], not {self.rate}")
        if self.below_acceptance is not None and not 0.0 < self.below_acceptance <= 1.0:
            raise ValueError(f"below-acceptance must be in (0, 1], not {self.below_acceptance}")
        if not 1 <= self.max_chars <= MAX_CAPTURE_CHARS:
            raise ValueError(f"max-chars must be in [1, {MAX_CAPTURE_CHARS}], not {self.max_chars}")
        if self.max_total_chars < 1 or not 0 < self.retention_s <= 400 * DAY_S:
            raise ValueError("max-total-chars must be positive and retention-days in (0, 400]")
        if self.prompt_tokens is not None and not 0 <= self.prompt_tokens[0] <= self.prompt_tokens[1]:
            raise ValueError(f"prompt-tokens must be LO-HI with 0 <= LO <= HI, not {self.prompt_tokens}")

    @property
    def enabled(self) -> bool:
        return self.rate > 0.0

    @classmethod
    def parse(cls, spec: str) -> CapturePolicy:
        """`rate=R[,tenant=T]...[,tag=K:V]...[,below-acceptance=A][,prompt-tokens=LO-HI][,max-chars=N]
        [,max-total-chars=N][,retention-days=D]`; ValueError naming what is wrong."""
        options: dict = {"tenants": set(), "tags": []}
        for item in filter(None, (part.strip() for part in spec.split(","))):
            key, sep, value = item.partition("=")
            if not sep or not value:
                raise ValueError(f"capture option {item!r} is not KEY=VALUE")
            _apply(options, key, value)
        if "rate" not in options:
            raise ValueError("a capture policy needs rate=R (0 < R <= 1)")
        options["tenants"], options["tags"] = frozenset(options["tenants"]), tuple(options["tags"])
        return cls(**options)

    def selects(self, request_id: str, tags: dict[str, str], prompt_tokens: int | None = None) -> bool:
        """What can be decided when the request arrives: sampled, its tenant and tags, its prompt band."""
        if not self.enabled or _fraction(request_id) >= self.rate:
            return False
        if self.tenants and tags.get("tenant") not in self.tenants:
            return False
        if any(tags.get(k) != v for k, v in self.tags):
            return False
        lo, hi = self.prompt_tokens or (0, None)
        return prompt_tokens is None or (prompt_tokens >= lo and (hi is None or prompt_tokens <= hi))

    def keeps(self, record: RequestRecord) -> bool:
        """The whole decision, once the request finished (its acceptance known)."""
        if record.status != "ok" or not self.selects(record.request_id, record.tags, record.prompt_tokens):
            return False
        if self.below_acceptance is None:
            return True
        drafted = record.num_draft_tokens
        return drafted > 0 and record.num_accepted_tokens / drafted < self.below_acceptance


def _apply(options: dict, key: str, value: str) -> None:
    try:
        if key in ("rate", "below-acceptance"):
            options[key.replace("-", "_")] = float(value)
        elif key == "tenant":
            options["tenants"].add(value)
        elif key == "tag":
            name, _, wanted = value.partition(":")
            options["tags"].append((name, wanted))
        elif key == "prompt-tokens":
            lo, _, hi = value.partition("-")
            options["prompt_tokens"] = (int(lo), int(hi))
        elif key in ("max-chars", "max-total-chars"):
            options[key.replace("-", "_")] = int(value)
        elif key == "retention-days":
            options["retention_s"] = float(value) * DAY_S
        else:
            raise ValueError(f"unknown capture option {key!r}")
    except (TypeError, ValueError) as exc:
        if "unknown capture option" in str(exc):
            raise
        raise ValueError(f"capture option {key}={value!r}: {exc}") from None


def _fraction(request_id: str) -> float:
    """A request id's place in [0, 1): the same on every producer (sha256, not Python's salted hash)."""
    return int.from_bytes(hashlib.sha256(request_id.encode()).digest()[:8], "big") / 2**64


Hook = Callable[[str], str]


@dataclass(frozen=True)
class Redactor:
    """What runs over every text before it is kept: each regex's matches replaced by `[redacted]`, then the
    hook (a `module:function` taking and returning a str). A hook that raises drops the capture: text is
    never kept unredacted."""

    patterns: tuple[re.Pattern, ...] = ()
    hook: Hook | None = None
    hook_name: str | None = field(default=None, compare=False)

    @classmethod
    def of(cls, patterns: Sequence[str] = (), hook: str | None = None) -> Redactor:
        """From the CLI's strings; ValueError for a bad regex or a hook that cannot be imported."""
        compiled = []
        for pattern in patterns:
            try:
                compiled.append(re.compile(pattern))
            except re.error as exc:
                raise ValueError(f"redaction regex {pattern!r}: {exc}") from None
        return cls(tuple(compiled), _import_hook(hook) if hook else None, hook)

    def __call__(self, text: str) -> tuple[str, int]:
        """The redacted text and how many regex matches it replaced."""
        total = 0
        for pattern in self.patterns:
            text, count = pattern.subn(REDACTED, text)
            total += count
        if self.hook is not None:
            text = self.hook(text)
            if not isinstance(text, str):
                raise TypeError(f"redaction hook {self.hook_name} returned {type(text).__name__}, not str")
        return text, total


def _import_hook(path: str) -> Hook:
    module, sep, name = path.partition(":")
    if not sep or not module or not name:
        raise ValueError(f"redaction hook {path!r} is not MODULE:FUNCTION")
    try:
        hook = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"redaction hook {path!r}: {exc}") from None
    if not callable(hook):
        raise ValueError(f"redaction hook {path!r} is not callable")
    return hook


def capped(text: str, limit: int) -> tuple[str, bool]:
    """`text` cut to `limit` characters (its cut marked), and whether it was cut."""
    if len(text) <= limit:
        return text, False
    return text[: max(0, limit - len(TRUNCATED))] + TRUNCATED, True


class Capturer:
    """A producer's capture step: the policy's decision, redaction, then the size caps (redacting before
    cutting, so a secret across the cut is redacted whole; a huge text is first cut to twice the cap so
    the regexes never scan it whole). Counts what it kept and dropped."""

    def __init__(self, policy: CapturePolicy, redact: Redactor | None = None) -> None:
        self.policy, self.redact = policy, redact or Redactor()
        self.sent_chars = 0
        self.kept = self.dropped_budget = self.dropped_hook = 0

    def capture(self, record: RequestRecord, prompt: list[dict], output: str, kind: Kind) -> Capture | None:
        if not self.policy.keeps(record):
            return None
        if self.sent_chars >= self.policy.max_total_chars:
            self.dropped_budget += 1
            return None
        try:
            messages, output_text, truncated, redactions = self._texts(prompt, output)
        except Exception:  # noqa: BLE001 - a failing redaction hook: keep nothing
            self.dropped_hook += 1
            return None
        if not messages:
            return None
        self.sent_chars += sum(len(m.content) for m in messages) + len(output_text)
        self.kept += 1
        return _capture(record, messages, output_text, kind, truncated, redactions, self.policy.retention_s)

    def _texts(self, prompt: list[dict], output: str) -> tuple[list[CaptureMessage], str, bool, int]:
        limit, cut, count = self.policy.max_chars, len(prompt) > MAX_CAPTURE_MESSAGES, 0
        messages = []
        for message in prompt[-MAX_CAPTURE_MESSAGES:]:  # the latest turns: the ones nearest the output
            text, n, was_cut = self._one(str(message.get("content") or ""), limit)
            role = message.get("role") if message.get("role") in ("system", "user", "assistant", "tool") else "user"
            messages.append(CaptureMessage(role=role, content=text))
            count, cut = count + n, cut or was_cut
        output_text, n, was_cut = self._one(output, limit)
        return messages, output_text, cut or was_cut, count + n

    def _one(self, text: str, limit: int) -> tuple[str, int, bool]:
        head, cut_early = capped(text.replace("\x00", ""), 2 * limit)
        redacted, count = self.redact(head)
        kept, cut = capped(redacted, limit)
        return kept, count, cut or cut_early


def _capture(record, messages, output, kind, truncated, redactions, retention_s) -> Capture:
    return Capture(
        capture_id=record.request_id,
        instance=record.instance,
        model=record.model,
        drafter=record.drafter,
        kind=kind,
        tags=record.tags,
        started_at=record.started_at,
        prompt=messages,
        output=output,
        prompt_tokens=record.prompt_tokens,
        output_tokens=record.output_tokens,
        num_draft_tokens=record.num_draft_tokens,
        num_accepted_tokens=record.num_accepted_tokens,
        truncated=truncated,
        redactions=redactions,
        expires_at=min(time.time() + retention_s, 4_102_444_800.0),
    )


def speculators_row(capture: dict, target_model: str) -> dict | None:
    """One line of vLLM `speculators`' conversation JSONL (`prepare_data.py --data PATH`): `conversations`,
    a list of `{"role", "content"}` turns ending with the captured output as the assistant's, the format its
    `preprocessing._normalize_conversation` reads. A completion capture (raw text, no chat turns) has no
    conversation: None."""
    if capture.get("kind") != "chat":
        return None
    turns = [{"role": m["role"], "content": m["content"]} for m in capture["prompt"]]
    turns.append({"role": "assistant", "content": capture["output"]})
    return {"id": capture["capture_id"], "conversations": turns, "target_model": target_model}
