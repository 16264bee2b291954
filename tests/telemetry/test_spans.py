"""Spans out (telemetry.spans): the record -> attributes mapping, when the variables switch spans on,
and parent links through the SDK's in-memory exporter (no network)."""

from __future__ import annotations

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

from specwatch.telemetry import spans
from specwatch.telemetry.schema import RequestRecord
from specwatch.telemetry.sink import TelemetrySink

CLIENT_TRACE, CLIENT_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
TRACEPARENT = f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"


def record(**fields) -> RequestRecord:
    base = dict(
        request_id="r1",
        instance="spec1",
        model="smollm",
        drafter="ngram",
        mode="speculative",
        mode_reason="canary",
        arm="spec",
        started_at=1.8e9,
        queue_s=0.01,
        ttft_s=0.2,
        e2e_s=1.5,
        prompt_tokens=40,
        output_tokens=30,
        num_drafts=6,
        num_draft_tokens=24,
        num_accepted_tokens=12,
        accepted_per_position=[5, 4, 2, 1],
        drafts_per_position=[6, 6, 6, 6],
        gamma=4,
        device_s=0.9,
        device_s_source="engine",
        tags={"tenant": "acme"},
    )
    return RequestRecord(**(base | fields))


def test_record_attributes_follow_gen_ai_and_put_speculation_under_one_namespace():
    attributes = spans.record_attributes(record())
    assert attributes["gen_ai.response.model"] == "smollm"
    assert (attributes["gen_ai.usage.input_tokens"], attributes["gen_ai.usage.output_tokens"]) == (40, 30)
    assert attributes["gen_ai.server.time_to_first_token"] == 0.2
    assert attributes["specwatch.spec.acceptance_rate"] == 0.5  # 12 / 24
    assert attributes["specwatch.spec.mean_acceptance_length"] == 3.0  # 1 + 12 / 6
    assert attributes["specwatch.spec.accepted_per_position"] == [5, 4, 2, 1]
    assert attributes["specwatch.spec.drafts_per_position"] == [6, 6, 6, 6]
    assert (attributes["specwatch.spec.drafter"], attributes["specwatch.spec.arm"]) == ("ngram", "spec")
    assert (attributes["specwatch.spec.mode_reason"], attributes["specwatch.spec.device_s"]) == ("canary", 0.9)
    assert attributes["specwatch.tag.tenant"] == "acme"
    speculative = {key for key in attributes if "draft" in key or "accept" in key}
    assert speculative and all(key.startswith(spans.SPEC) for key in speculative)


def test_a_plain_request_has_no_ratio_and_no_none_value():
    drafts = dict(num_drafts=0, num_draft_tokens=0, num_accepted_tokens=0, accepted_per_position=[], gamma=0)
    drafts |= dict(drafts_per_position=[])
    attributes = spans.record_attributes(record(drafter=None, mode="autoregressive", arm=None, **drafts))
    assert "specwatch.spec.acceptance_rate" not in attributes and "specwatch.spec.drafter" not in attributes
    assert "specwatch.spec.accepted_per_position" not in attributes
    assert None not in attributes.values()


def test_request_attributes_take_only_well_typed_fields_of_an_untrusted_body():
    body = {"model": "m", "max_completion_tokens": 64, "temperature": "hot", "top_p": True, "seed": 7}
    assert spans.request_attributes("chat", body) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.request.model": "m",
        "gen_ai.request.max_tokens": 64,
        "gen_ai.request.seed": 7,
    }
    assert spans.operation("/v1/completions") == "text_completion"


@pytest.mark.parametrize(
    ("environ", "on"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://h:1/v1/traces"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://h:1", "OTEL_SDK_DISABLED": "true"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://h:1", "OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "  "}, False),
    ],
)
def test_spans_are_off_unless_an_otlp_endpoint_is_set(environ, on):
    assert spans.enabled(environ) is on
    assert (spans.RequestSpans.from_env("x", environ) is not None) is on


def test_the_endpoint_resolves_as_the_exporter_does():
    assert spans.endpoint({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://h:4318/"}) == "http://h:4318/v1/traces"
    both = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://h:4318", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://t/x"}
    assert spans.endpoint(both) == "http://t/x"


def make_sink() -> tuple[TelemetrySink, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    return TelemetrySink("gw", spans=spans.RequestSpans("specwatch-test", exporter)), exporter


def finished(sink: TelemetrySink, exporter: InMemorySpanExporter):
    assert sink.spans.flush()
    return exporter.get_finished_spans()


def test_a_span_continues_the_callers_trace_and_hands_its_own_on():
    sink, exporter = make_sink()
    body = {"model": "smollm", "max_tokens": 30}
    forward = sink.begin_span("r1", {"traceparent": TRACEPARENT}, "/v1/chat/completions", body)
    assert forward["traceparent"].startswith(f"00-{CLIENT_TRACE}-") and CLIENT_SPAN not in forward["traceparent"]
    assert finished(sink, exporter) == ()  # nothing before the record
    sink.put(record())
    (span,) = finished(sink, exporter)
    assert span.name == "chat smollm" and span.kind is SpanKind.SERVER
    assert format(span.context.trace_id, "032x") == CLIENT_TRACE
    assert format(span.parent.span_id, "016x") == CLIENT_SPAN and span.parent.is_remote
    assert forward["traceparent"] == f"00-{CLIENT_TRACE}-{span.context.span_id:016x}-01"
    assert span.attributes["gen_ai.request.max_tokens"] == 30
    assert span.attributes["specwatch.spec.accepted_tokens"] == 12
    assert span.resource.attributes["service.name"] == "specwatch-test"


def test_an_error_record_sets_the_error_status_and_a_dropped_span_is_never_exported():
    sink, exporter = make_sink()
    sink.begin_span("refused", {}, "/v1/completions", {})
    sink.drop_span("refused")
    sink.begin_span("r2", {}, "/v1/completions", {})
    sink.put(record(request_id="r2", status="error", error="upstream:timeout"))
    (span,) = finished(sink, exporter)
    assert span.parent is None  # no traceparent: a new trace
    assert span.status.status_code is StatusCode.ERROR and span.attributes["error.type"] == "upstream:timeout"


def test_a_record_without_a_begun_span_gets_one_timed_by_the_record():
    sink, exporter = make_sink()
    sink.put(record(request_id="no-route"))
    (span,) = finished(sink, exporter)
    assert span.start_time == int(1.8e9 * 1e9) and span.attributes["gen_ai.request.id"] == "no-route"
