"""Spans out: one OpenTelemetry span per request from the gateway and from the engine (docs/otlp.md).

Off unless `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set (and neither
`OTEL_SDK_DISABLED=true` nor `OTEL_TRACES_EXPORTER=none`); the SDK's OTLP/HTTP protobuf exporter reads
every other `OTEL_EXPORTER_OTLP_*` variable (headers, timeout, compression, certificate), its batch
processor the `OTEL_BSP_*` ones, the sampler `OTEL_TRACES_SAMPLER`. The request path only records: a
`BatchSpanProcessor` exports from its own thread.

A request's span starts when the request arrives (`RequestSpans.begin`, which continues the caller's
W3C `traceparent` and returns the headers that carry the new span on to an upstream) and ends when its
RequestRecord is emitted (`RequestSpans.finish`, a TelemetrySink consumer), with the record's fields as
attributes (`record_attributes`, the one mapping the engine and the gateway share): the GenAI semantic
conventions where they have a name, the speculative fields under `specwatch.spec.*`.

The SDK is imported when spans are switched on, never by importing this module: telemetry stays light.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping
from typing import Any

from specwatch.telemetry.schema import RequestRecord

log = logging.getLogger("specwatch.telemetry")

SPEC = "specwatch.spec."  # the namespace of the speculative-decoding attributes
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
TRACE_HEADERS = ("traceparent", "tracestate")
MAX_OPEN = 65_536  # spans begun and not yet finished; past this the oldest is dropped (never exported)
_REQUEST_FIELDS = {  # gen_ai.request.* from an OpenAI request body, with the JSON types they must have
    "gen_ai.request.max_tokens": (("max_tokens", "max_completion_tokens"), int),
    "gen_ai.request.temperature": (("temperature",), (int, float)),
    "gen_ai.request.top_p": (("top_p",), (int, float)),
    "gen_ai.request.seed": (("seed",), int),
}


def enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the standard variables ask for spans: an OTLP endpoint set, the SDK not disabled."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    if environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() == "none":
        return False
    return any(environ.get(name, "").strip() for name in ENDPOINT_VARIABLES)


def endpoint(environ: Mapping[str, str] = os.environ) -> str | None:
    """Where the spans go, as the exporter resolves it (for the start-up line)."""
    if traces := environ.get(ENDPOINT_VARIABLES[0], "").strip():
        return traces
    base = environ.get(ENDPOINT_VARIABLES[1], "").strip()
    return base.rstrip("/") + "/v1/traces" if base else None


def operation(path: str) -> str:
    """gen_ai.operation.name of an OpenAI route."""
    return "chat" if path.endswith("/chat/completions") else "text_completion"


def request_attributes(operation: str, body: Mapping[str, Any]) -> dict[str, Any]:
    """gen_ai.* attributes known when the request arrives, from its (untrusted) JSON body."""
    attributes: dict[str, Any] = {"gen_ai.operation.name": operation}
    if isinstance(model := body.get("model"), str) and model:
        attributes["gen_ai.request.model"] = model[:256]
    for name, (keys, kind) in _REQUEST_FIELDS.items():
        value = next((body.get(k) for k in keys if body.get(k) is not None), None)
        if isinstance(value, kind) and not isinstance(value, bool):
            attributes[name] = value
    return attributes


def record_attributes(record: RequestRecord) -> dict[str, Any]:
    """The span's attributes from a finished request's record (None values left out)."""
    attributes = {
        "gen_ai.request.id": record.request_id,
        "gen_ai.response.model": record.model,
        "gen_ai.usage.input_tokens": record.prompt_tokens,
        "gen_ai.usage.output_tokens": record.output_tokens,
        "gen_ai.server.time_to_first_token": record.ttft_s,
        "gen_ai.latency.time_in_queue": record.queue_s,  # vLLM's llm_request span names these two
        "gen_ai.latency.e2e": record.e2e_s,
        "error.type": record.error,
        "specwatch.instance": record.instance,
        "specwatch.status": record.status,
        "specwatch.retries": record.retries,
        **{f"specwatch.tag.{key}": value for key, value in record.tags.items()},
        **_spec_attributes(record),
    }
    return {key: value for key, value in attributes.items() if value is not None}


def _spec_attributes(record: RequestRecord) -> dict[str, Any]:
    """specwatch.spec.*: how the request was decoded, what its drafts cost and how many were accepted."""
    spec = {
        "drafter": record.drafter,
        "mode": record.mode,
        "mode_reason": record.mode_reason,
        "arm": record.arm,
        "draft_counts_known": record.draft_counts_known,
        "num_drafts": record.num_drafts,
        "draft_tokens": record.num_draft_tokens,
        "accepted_tokens": record.num_accepted_tokens,
        "acceptance_rate": record.acceptance_rate,  # accepted / draft tokens
        "mean_acceptance_length": record.mean_acceptance_length,  # 1 + accepted / drafts
        "gamma": record.gamma,
        "accepted_per_position": list(record.accepted_per_position) or None,  # an empty list: no attribute
        "drafts_per_position": list(record.drafts_per_position) or None,
        "mean_lookahead": record.mean_lookahead,
        "draft_s": record.draft_s,
        "verify_s": record.verify_s,
        "device_s": record.device_s,
        "device_s_source": record.device_s_source,
        "failed_device_s": record.failed_device_s,
    }
    return {SPEC + key: value for key, value in spec.items()}


class RequestSpans:
    """One span per request, exported over OTLP/HTTP by a batch processor. `exporter`: the SDK's
    OTLP/HTTP exporter configured by the environment unless given (a test's in-memory one)."""

    def __init__(self, service_name: str, exporter=None) -> None:
        from opentelemetry.propagators.textmap import DefaultGetter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporter = OTLPSpanExporter()
        resource = Resource.create({"service.name": os.environ.get("OTEL_SERVICE_NAME") or service_name})
        self.provider = TracerProvider(resource=resource)
        self.provider.add_span_processor(BatchSpanProcessor(exporter))
        self._tracer = self.provider.get_tracer("specwatch")
        self._propagator, self._getter = TraceContextTextMapPropagator(), DefaultGetter()
        self._open: dict[str, Any] = {}  # request id -> (span, its operation), begun and not finished
        self._lock = threading.Lock()  # begin runs on the event loop, finish on the engine's scheduler thread

    @classmethod
    def from_env(cls, service_name: str, environ: Mapping[str, str] = os.environ) -> RequestSpans | None:
        """Spans when the standard variables ask for them (`enabled`), else None."""
        return cls(service_name) if enabled(environ) else None

    def begin(self, request_id: str, headers: Mapping[str, str], attributes: dict[str, Any]) -> dict[str, str]:
        """Start the request's span as a child of the caller's `traceparent` (a new trace without one);
        the `traceparent`/`tracestate` headers that make an upstream's span a child of this one."""
        from opentelemetry.trace import SpanKind, set_span_in_context

        carrier = {k: v for k in TRACE_HEADERS if (v := headers.get(k))}
        parent = self._propagator.extract(carrier, getter=self._getter)
        name = f"{attributes['gen_ai.operation.name']} {attributes.get('gen_ai.request.model', '')}".strip()
        span = self._tracer.start_span(name, context=parent, kind=SpanKind.SERVER, attributes=attributes)
        with self._lock:
            self._open.pop(request_id, None)  # a reused id: the earlier span is dropped
            self._open[request_id] = span
            if len(self._open) > MAX_OPEN:
                del self._open[next(iter(self._open))]
        forward: dict[str, str] = {}
        self._propagator.inject(forward, context=set_span_in_context(span))
        return forward

    def drop(self, request_id: str) -> None:
        """Forget a begun span that will get no record (a request refused before it ran): never exported."""
        with self._lock:
            self._open.pop(request_id, None)

    def finish(self, record: RequestRecord) -> None:
        """End the record's span with the record's attributes (a TelemetrySink consumer). A record whose
        request began no span (emitted outside a server route) gets one of its own, timed by the record."""
        with self._lock:
            span = self._open.pop(record.request_id, None)
        if span is None:
            span = self._tracer.start_span(f"request {record.model}", start_time=int(record.started_at * 1e9))
        span.set_attributes(record_attributes(record))
        if record.status == "error":
            from opentelemetry.trace import Status, StatusCode

            span.set_status(Status(StatusCode.ERROR, record.error))
        span.end()

    def flush(self, timeout_s: float = 5.0) -> bool:
        return self.provider.force_flush(int(timeout_s * 1000))

    def shutdown(self) -> None:
        """Export what is queued and stop the processor (at the server's exit)."""
        self.provider.shutdown()
