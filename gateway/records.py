"""One RequestRecord per proxied request, from the gateway's own timings and the upstream's response.

The upstream's response says (vLLM 0.32 with `--enable-per-request-metrics` and
`--per-request-spec-decode-metrics summary`; our engine always):

    usage    = {prompt_tokens, completion_tokens, ...}
    metrics  = {time_to_first_token_ms, queue_time_ms, generation_time_ms, ...,
                speculative_decoding: {acceptance_histogram, num_spec_steps, num_draft_tokens,
                                       num_accepted_draft_tokens, num_spec_tokens, ...} | null}

`acceptance_histogram[j]` counts the verify steps that accepted exactly j draft tokens, so
position i (0-based) was accepted in every step with more than i accepted:
`accepted_per_position[i] = sum(histogram[i + 1:])` - the list vLLM's
`vllm:spec_decode_num_accepted_tokens_per_pos` counter adds up over all requests.
A speculative upstream's response without `speculative_decoding` is recorded with
`draft_counts_known = False` (timings and tokens only), so acceptance queries skip it, and tagged
`spec_counts_unknown` with why (n > 1, no usage chunk, a vLLM before 0.29, not enabled: gateway.vllm_metrics).
With `--per-request-spec-decode-metrics detailed`, vLLM adds `per_step_drafted` (and
`per_step_accepted`): the drafts that reached each position are counted from it
(`drafts_per_position`), the denominators of per-position acceptance when drafts vary in length.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import ValidationError

from specwatch.common.http import error_body
from specwatch.gateway import vllm_metrics
from specwatch.gateway.counts import DraftCounts, draft_counts  # noqa: F401 - also read from here (tune_profile)
from specwatch.gateway.llamacpp import has_draft_timings, llamacpp_tags
from specwatch.gateway.sglang import has_spec_counts, sglang_counts
from specwatch.telemetry.capture import MAX_CAPTURE_CHARS
from specwatch.telemetry.schema import GATEWAY_TAG, MAX_TAGS, MAX_TOKENS, RequestRecord

UPSTREAM_TAG = "upstream"  # the gateway's name for the upstream, where the record carries the engine's own

log = logging.getLogger("specwatch.gateway")


@dataclass
class Outcome:
    """What the proxy saw of one request; `record()` turns it into the telemetry record."""

    request_id: str
    started_at: float  # epoch s, request arrival
    model: str
    prompt_tokens_estimate: int
    tags: dict[str, str]
    mode_reason: str
    arm: str | None
    load_at_admission: float | None
    pool: str = "spec"  # the pool it was routed to (the other one after a failover)
    retries: int = 0
    instance: str = ""  # the upstream's name (routing, health, sharing)
    reported_instance: str | None = None  # the name a specwatch engine upstream gives itself: the record's
    drafter: str | None = None
    ttft_s: float | None = None
    e2e_s: float = 0.0
    status: str = "ok"
    error: str | None = None
    usage: dict | None = None
    metrics: dict | None = None
    meta_info: dict | None = None  # SGLang's per-request `meta_info` (gateway.sglang), where the answer has one
    timings: dict | None = None  # llama.cpp's per-request `timings` (gateway.llamacpp), where the answer has one
    shared_from: float | None = None  # its upstream's ProcessorSharing mark while it is in flight there
    device_s: float | None = None  # its processor-sharing share of the upstream's time; None: never sent
    n: int = 1  # the choices the client asked for (vLLM reports per-request metrics for n = 1 only)
    streamed: bool = False
    engine_version: str | None = None  # the upstream's vLLM version (gateway.markers), where known
    capture: tuple[list[dict], str] | None = None  # the prompt and kind, when the request may be captured
    output_text: str | None = None  # the answer's text, kept only for a capture (capped)

    def record(self, gateway: str | None = None) -> RequestRecord:
        """The telemetry record; `gateway` (its name) tags it `gateway=<name>`, over a client's tag of that key."""
        if gateway:
            self.tags[GATEWAY_TAG] = gateway  # in place: the request's own dict (gateway.parsing.tags)
        if self.reported_instance and self.reported_instance != self.instance:
            self.tags[UPSTREAM_TAG] = self.instance  # the engine's own name is the record's instance
        metrics = self.metrics if isinstance(self.metrics, dict) else {}
        counts = self._draft_counts(metrics) if self.drafter else DraftCounts()
        fields = {
            "request_id": self.request_id,
            "instance": self.reported_instance or self.instance,
            "model": self.model,
            "drafter": self.drafter,
            "mode": "speculative" if self.drafter else "autoregressive",
            "mode_reason": self.mode_reason,
            "arm": self.arm,
            "started_at": self.started_at,
            "queue_s": _seconds(metrics.get("queue_time_ms")) or 0.0,
            "ttft_s": self.ttft_s if self.ttft_s is not None else self._upstream_ttft(metrics),
            "e2e_s": self.e2e_s,
            **self._tokens(),
            **_counts_fields(counts),
            "retries": self.retries,
            "status": self.status,
            "error": self.error,
            "load_at_admission": None if self.load_at_admission is None else min(self.load_at_admission, 1000.0),
            "tags": self.tags,
            **self._device_fields(),
        }
        try:
            return RequestRecord.model_validate(fields)
        except ValidationError as exc:  # an upstream's counts that break the contract: keep timings and tokens
            log.warning("request %s: upstream %s sent inconsistent metrics (%s)", self.request_id, self.instance, exc)
            return RequestRecord.model_validate({**fields, **_counts_fields(None)})

    def _draft_counts(self, metrics: dict) -> DraftCounts | None:
        """vLLM's `metrics.speculative_decoding` (gateway.vllm_metrics: unknown counts tagged with why), else
        SGLang's `meta_info`, else llama.cpp's `timings` (their own figures and any clamp become tags: a clamped
        count is flagged, never stored as sound)."""
        completion = self._tokens()["output_tokens"] if self._has_usage() else None
        if metrics.get("speculative_decoding") is None and has_spec_counts(self.meta_info):
            found = sglang_counts(self.meta_info, completion)
            self._add_tags(found.tags)
            return found.counts
        if metrics.get("speculative_decoding") is None and has_draft_timings(self.timings):
            self._add_tags(llamacpp_tags(self.timings, completion))
            return None  # no verify-step count: draft counts unknown (gateway.llamacpp)
        found = vllm_metrics.read(
            metrics, n=self.n, streamed=self.streamed, usage=self._has_usage(), version=self.engine_version
        )
        if found.unknown and self.status == "ok":
            self._add_tags({vllm_metrics.UNKNOWN_TAG: found.unknown})
        return found.counts

    def _add_tags(self, tags: dict[str, str]) -> None:
        for key, value in tags.items():
            if key in self.tags or len(self.tags) < MAX_TAGS:
                self.tags[key] = value
            else:
                log.warning("request %s: no room for tag %s=%s", self.request_id, key, value)

    def _has_usage(self) -> bool:
        usage = self._usage()
        return type(usage.get("completion_tokens")) is int

    def _usage(self) -> dict:
        """OpenAI's `usage`, else the token counts in SGLang's native `meta_info`."""
        if isinstance(self.usage, dict):
            return self.usage
        return self.meta_info if isinstance(self.meta_info, dict) else {}

    def _device_fields(self) -> dict:
        if self.device_s is None:
            return {}
        return {"device_s": min(self.device_s, 86_400.0), "device_s_source": "processor_sharing"}

    def _tokens(self) -> dict:
        usage = self._usage()
        prompt, completion = usage.get("prompt_tokens"), usage.get("completion_tokens")
        return {
            "prompt_tokens": prompt if _is_count(prompt) else self.prompt_tokens_estimate,
            "output_tokens": completion if _is_count(completion) else 0,
        }

    @staticmethod
    def _upstream_ttft(metrics: dict) -> float | None:
        """A non-streamed response has no first chunk here: the upstream's queue + TTFT (no network)."""
        ttft = _seconds(metrics.get("time_to_first_token_ms"))
        return None if ttft is None else ttft + (_seconds(metrics.get("queue_time_ms")) or 0.0)


def _counts_fields(counts: DraftCounts | None) -> dict:
    if counts is None:
        return {"draft_counts_known": False, **_counts_fields(DraftCounts())}
    return {
        "num_drafts": counts.num_drafts,
        "num_draft_tokens": counts.num_draft_tokens,
        "num_accepted_tokens": counts.num_accepted_tokens,
        "accepted_per_position": list(counts.accepted_per_position),
        "gamma": counts.gamma,
        "drafts_per_position": list(counts.drafts_per_position),
    }


def _seconds(ms: Any) -> float | None:
    if type(ms) not in (int, float) or not 0 <= ms <= 86_400_000:
        return None
    return ms / 1000.0


NOTED_KEYS = (b'"usage"', b'"metrics"', b'"meta_info"', b'"timings"', b'"error"')
MAX_EVENT_BYTES = 1024 * 1024
MAX_COLLECTED = 2 * MAX_CAPTURE_CHARS  # a captured answer's text kept while it streams (the capture cuts it again)


class SseReader:
    """Splits an upstream's SSE bytes into events as they arrive and notes what the record needs:
    the first content chunk, the final usage and metrics, an in-band error. Events are passed on
    whole and unchanged, except the usage-only chunk the gateway asked for on the client's behalf."""

    def __init__(self, drop_usage_chunk: bool, collect_text: bool = False) -> None:
        self.drop_usage_chunk = drop_usage_chunk
        # a capture's answer: every content chunk parsed and its text kept, up to MAX_COLLECTED characters
        self.collected: list[str] | None = [] if collect_text else None
        self.collected_chars = 0
        self.buffer = b""
        self.saw_content = False
        self.usage: dict | None = None
        self.metrics: dict | None = None
        self.meta_info: dict | None = None  # SGLang's, the last one sent (it is cumulative)
        self.timings: dict | None = None  # llama.cpp's, the last one sent (on the last chunk)
        self.error: str | None = None
        self.malformed = 0
        self.done = False  # the upstream's [DONE] went through
        self.content_chunks = 0  # chunks passed on that carried generated text (each at least one token)

    def feed(self, data: bytes) -> bytes:
        """The complete events in `data` (and before it) to pass on; a partial event waits for the rest."""
        self.buffer += data
        if b"\r" in self.buffer:
            self.buffer = self.buffer.replace(b"\r\n", b"\n")
        if b"\n\n" not in self.buffer:
            if len(self.buffer) > MAX_EVENT_BYTES:  # no event framing: pass it on rather than hold it all
                self.malformed += 1
                return self.rest()
            return b""
        *events, self.buffer = self.buffer.split(b"\n\n")
        return b"".join(out for event in events if (out := self._event(event)))

    def rest(self) -> bytes:
        """Whatever the upstream sent after its last complete event."""
        rest, self.buffer = self.buffer, b""
        return rest

    def broken(self, message: str) -> bytes:
        """What the client gets when the upstream broke off: an in-band error, as OpenAI sends one, and the end."""
        return b"data: " + orjson.dumps(error_body(message)) + b"\n\ndata: [DONE]\n\n"

    def delivered_usage(self) -> dict | None:
        """A stream cut before its end: the last usage an upstream sent (vLLM's continuous usage), else the
        content chunks passed on as its completion tokens (a lower bound: a chunk holds one step's tokens)."""
        if self.usage is not None:
            return self.usage
        return {"completion_tokens": self.content_chunks} if self.content_chunks else None

    def note(self, outcome: Outcome) -> None:
        """The outcome of a stream that ended: its usage and metrics; an error unless it ended well."""
        if self.error or self.malformed or not self.done:
            outcome.status = "error"
            outcome.error = "upstream:stream_error" if self.error else "upstream:malformed_stream"
        outcome.usage, outcome.metrics, outcome.meta_info = self.usage, self.metrics, self.meta_info
        outcome.timings = self.timings
        if self.collected is not None:
            outcome.output_text = "".join(self.collected)

    def _event(self, event: bytes) -> bytes:
        payload = event[6:] if event.startswith(b"data: ") else (event[5:] if event.startswith(b"data:") else None)
        if payload is None or payload == b"[DONE]":
            self.done = self.done or payload == b"[DONE]"
            return event + b"\n\n"
        if self.saw_content and self.collected is None and not any(key in payload for key in NOTED_KEYS):
            # a content chunk after the first: nothing to note; parsing every token's chunk costs CPU the
            # upstream may share, so only its outline is checked
            if not (payload.startswith(b"{") and payload.rstrip().endswith(b"}")):
                self.malformed += 1
            else:
                self.content_chunks += 1
            return event + b"\n\n"
        try:
            chunk = orjson.loads(payload)
        except orjson.JSONDecodeError:
            self.malformed += 1
            return event + b"\n\n"
        if not isinstance(chunk, dict):
            self.malformed += 1
            return event + b"\n\n"
        return event + b"\n\n" if self._note(chunk) else b""

    def _note(self, chunk: dict) -> bool:
        """Notes the chunk; False when it is the usage chunk to drop."""
        if "error" in chunk:
            error = chunk["error"]
            self.error = str(error.get("message") if isinstance(error, dict) else error)[:200]
        choices = chunk.get("choices") or []
        if any(_has_content(choice) for choice in choices) or _native_text(chunk):
            self.saw_content = True
            self.content_chunks += 1
            self._collect(choices, chunk)
        if isinstance(chunk.get("timings"), dict):  # llama.cpp: on its usage chunk too, which may be dropped
            self.timings = chunk["timings"]
        if isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
            if isinstance(chunk.get("metrics"), dict):
                self.metrics = chunk["metrics"]
            return not (self.drop_usage_chunk and not choices)
        if isinstance(chunk.get("metrics"), dict):
            self.metrics = chunk["metrics"]
        if isinstance(chunk.get("meta_info"), dict):
            self.meta_info = chunk["meta_info"]
        return True

    def _collect(self, choices: list, chunk: dict) -> None:
        if self.collected is None or self.collected_chars >= MAX_COLLECTED:
            return
        texts = [_choice_text(c) for c in choices[:1]] if choices else [chunk.get("text")]
        for text in texts:
            if isinstance(text, str):
                self.collected.append(text[: MAX_COLLECTED - self.collected_chars])
                self.collected_chars += len(self.collected[-1])


def _choice_text(choice: Any) -> str | None:
    delta = choice.get("delta") if isinstance(choice, dict) else None
    return (
        delta.get("content") if isinstance(delta, dict) else (choice.get("text") if isinstance(choice, dict) else None)
    )


def _has_content(choice: Any) -> bool:
    if not isinstance(choice, dict):
        return False
    delta = choice.get("delta")
    return bool(choice.get("text") or (isinstance(delta, dict) and (delta.get("content") or delta.get("tool_calls"))))


def _is_count(value: object) -> bool:
    """A token count the contract takes (an upstream's usage past MAX_TOKENS would fail the record)."""
    return type(value) is int and 0 <= value <= MAX_TOKENS


def _native_text(chunk: dict) -> bool:
    """A chunk of SGLang's native /generate stream that carries generated text (it has no `choices`)."""
    return "meta_info" in chunk and isinstance(chunk.get("text"), str) and bool(chunk["text"])
