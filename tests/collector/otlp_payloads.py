"""Hand-built OTLP export requests (opentelemetry-proto message classes), as vLLM 0.32 sends its
`llm_request` spans, in both of OTLP/HTTP's encodings."""

from __future__ import annotations

import base64

import orjson
from collector_payloads import T0
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span

TRACE_ID = bytes.fromhex("4bf92f3577b34da6a3ce929d0e0e4736")


def value(v: object) -> AnyValue:
    if isinstance(v, bool):
        return AnyValue(bool_value=v)
    if isinstance(v, int):
        return AnyValue(int_value=v)
    if isinstance(v, float):
        return AnyValue(double_value=v)
    return AnyValue(string_value=str(v))


def key_values(attrs: dict) -> list[KeyValue]:
    return [KeyValue(key=k, value=value(v)) for k, v in attrs.items()]


def vllm_attributes(request_id: str, **changes) -> dict:
    """The attributes vLLM 0.32's OutputProcessor.do_tracing sets (a key given as None is left out)."""
    attrs = {
        "gen_ai.latency.time_to_first_token": 0.25,
        "gen_ai.latency.e2e": 1.5,
        "gen_ai.latency.time_in_queue": 0.05,
        "gen_ai.usage.prompt_tokens": 120,
        "gen_ai.usage.completion_tokens": 48,
        "gen_ai.latency.time_in_model_prefill": 0.2,
        "gen_ai.latency.time_in_model_decode": 1.25,
        "gen_ai.latency.time_in_model_inference": 1.45,
        "gen_ai.request.id": request_id,
        "gen_ai.request.max_tokens": 48,
        "gen_ai.request.n": 1,
    }
    return {k: v for k, v in (attrs | changes).items() if v is not None}


def span(request_id: str, index: int = 0, name: str = "llm_request", **changes) -> Span:
    start = int((T0 + index) * 1e9)
    return Span(
        trace_id=TRACE_ID,
        span_id=(index + 1).to_bytes(8, "big"),
        name=name,
        kind=Span.SPAN_KIND_SERVER,
        start_time_unix_nano=start,
        end_time_unix_nano=start + 1_500_000_000,
        attributes=key_values(vllm_attributes(request_id, **changes)),
    )


def export(spans: list[Span], resource: dict | None = None) -> ExportTraceServiceRequest:
    resource = {"service.name": "vllm-0", "vllm.process_id": "4242"} if resource is None else resource
    scope = ScopeSpans(spans=spans)
    return ExportTraceServiceRequest(
        resource_spans=[ResourceSpans(resource=Resource(attributes=key_values(resource)), scope_spans=[scope])]
    )


def as_json(message: ExportTraceServiceRequest) -> bytes:
    """OTLP's JSON mapping: protobuf's JSON with trace and span ids in hex rather than base64."""
    payload = json_format.MessageToDict(message)
    for resource_spans in payload.get("resourceSpans", []):
        for scope_spans in resource_spans.get("scopeSpans", []):
            for item in scope_spans.get("spans", []):
                for key in ("traceId", "spanId", "parentSpanId"):
                    if key in item:
                        item[key] = base64.b64decode(item[key]).hex()
    return orjson.dumps(payload)
