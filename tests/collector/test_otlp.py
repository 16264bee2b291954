"""POST /v1/traces: vLLM's llm_request spans (OTLP/HTTP, protobuf and JSON) become request records,
through the ingest path (idempotent, guarded by the ingest token); bad bodies are refused whole."""

from __future__ import annotations

import gzip

import pytest
from collector_payloads import T0
from fastapi.testclient import TestClient
from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.proto.trace.v1.trace_pb2 import Status
from otlp_payloads import TRACE_ID, as_json, export, span

from specwatch.collector.ingest import otlp
from specwatch.collector.settings import Settings
from specwatch.service.app import create_app
from specwatch.telemetry.schema import MAX_BATCH_RECORDS

PROTOBUF = {"content-type": "application/x-protobuf"}
JSON = {"content-type": "application/json"}


def post(client: TestClient, message, encoding: str = "protobuf", headers: dict | None = None):
    body = message.SerializeToString() if encoding == "protobuf" else as_json(message)
    return client.post(
        "/v1/traces", content=body, headers={**(PROTOBUF if encoding == "protobuf" else JSON), **(headers or {})}
    )


def answer(response) -> ExportTraceServiceResponse:
    parsed = ExportTraceServiceResponse()
    if response.headers["content-type"].startswith("application/x-protobuf"):
        parsed.ParseFromString(response.content)
    else:
        json_format.Parse(response.text, parsed)
    return parsed


def stored(client: TestClient, request_id: str) -> dict | None:
    found = client.get(f"/v1/requests/{request_id}")
    return found.json()["record"] if found.status_code == 200 else None


def count(client: TestClient) -> int:
    return len(client.get("/v1/requests", params={"start": T0 - 10, "end": T0 + 3600}).json()["rows"])


@pytest.mark.parametrize("encoding", ["protobuf", "json"])
def test_llm_request_spans_become_records_other_spans_are_ignored(client, encoding):
    spans = [span("cmpl-a", 0), span("cmpl-b", 1), span("", 2, name="chat_completion")]
    response = post(client, export(spans), encoding)
    assert response.status_code == 200, response.text
    assert response.headers["content-type"].startswith(
        PROTOBUF["content-type"] if encoding == "protobuf" else "application/json"
    )
    assert not answer(response).HasField("partial_success")
    record = stored(client, "cmpl-a")
    assert record["instance"] == "vllm-0" and record["model"] == "unknown"
    assert record["started_at"] == pytest.approx(T0)
    assert (record["queue_s"], record["ttft_s"], record["e2e_s"]) == pytest.approx((0.05, 0.25, 1.5))
    assert (record["prompt_tokens"], record["output_tokens"]) == (120, 48)
    assert record["draft_counts_known"] is False and record["num_draft_tokens"] == 0
    assert record["mode"] == "autoregressive" and record["drafter"] is None and record["status"] == "ok"
    assert record["tags"] == {"trace_id": TRACE_ID.hex()}
    assert stored(client, "cmpl-b")["started_at"] == pytest.approx(T0 + 1)
    assert count(client) == 2


def test_a_resent_export_is_stored_once(client):
    message = export([span("cmpl-a", 0), span("cmpl-b", 1)])
    assert post(client, message).status_code == 200
    assert post(client, message, "json").status_code == 200
    assert count(client) == 2


def test_resource_names_the_model_drafter_and_host(client):
    resource = {
        "service.name": "unknown_service",
        "host.name": "node-7",
        "gen_ai.request.model": "SmolLM2",
        "specwatch.drafter": "ngram",
    }
    assert post(client, export([span("cmpl-a")], resource)).status_code == 200
    record = stored(client, "cmpl-a")
    assert (record["instance"], record["model"], record["drafter"], record["mode"]) == (
        "node-7",
        "SmolLM2",
        "ngram",
        "speculative",
    )
    assert record["draft_counts_known"] is False


def test_the_span_end_stands_in_for_a_missing_e2e_and_an_error_status_is_kept(client):
    failed = span("cmpl-a", **{"gen_ai.latency.e2e": None})
    failed.status.CopyFrom(Status(code=Status.STATUS_CODE_ERROR, message="engine dead"))
    assert post(client, export([failed])).status_code == 200
    record = stored(client, "cmpl-a")
    assert record["e2e_s"] == pytest.approx(1.5)
    assert (record["status"], record["error"]) == ("error", "span:engine dead")


def test_spans_that_make_no_record_are_counted_in_partial_success(client):
    spans = [
        span("cmpl-good", 0),
        span("cmpl-no-tokens", 1, **{"gen_ai.usage.prompt_tokens": None}),
        span("cmpl-negative", 2, **{"gen_ai.latency.e2e": -1.0}),
        span("cmpl-string", 3, **{"gen_ai.usage.completion_tokens": "48"}),
    ]
    response = post(client, export(spans), "json")
    assert response.status_code == 200
    partial = answer(response).partial_success
    assert partial.rejected_spans == 3
    assert "gen_ai.usage.prompt_tokens" in partial.error_message and "e2e_s" in partial.error_message
    assert stored(client, "cmpl-good") is not None and count(client) == 1


def test_a_resource_without_a_name_rejects_its_spans(client):
    response = post(client, export([span("cmpl-a")], {"service.name": "unknown_service:python"}))
    partial = answer(response).partial_success
    assert partial.rejected_spans == 1 and "OTEL_SERVICE_NAME" in partial.error_message
    assert count(client) == 0


def test_a_gzipped_export_is_read(client):
    body = gzip.compress(export([span("cmpl-a")]).SerializeToString())
    response = client.post("/v1/traces", content=body, headers={**PROTOBUF, "content-encoding": "gzip"})
    assert response.status_code == 200 and stored(client, "cmpl-a") is not None


@pytest.mark.parametrize(
    ("body", "headers", "status", "words"),
    [
        (b"\x0a\xff\xff\xff\x0f", PROTOBUF, 400, "protobuf"),
        (b"{not json", JSON, 400, "invalid_json"),
        (b"[1, 2]", JSON, 400, "object"),
        (b'{"resourceSpans": "many"}', JSON, 400, "JSON"),
        (
            b'{"resourceSpans": [{"scopeSpans": [{"spans": [{"name": "llm_request", "traceId": "zz"}]}]}]}',
            JSON,
            400,
            "hex",
        ),
        (b"{}", {"content-type": "text/plain"}, 415, "application/x-protobuf"),
        (b"{}", {}, 415, "Content-Type"),
        (b"{}", {**JSON, "content-encoding": "br"}, 415, "Content-Encoding"),
        (b"not gzip", {**PROTOBUF, "content-encoding": "gzip"}, 400, "invalid_gzip"),
    ],
)
def test_bad_bodies_are_refused_with_a_message(client, registry, body, headers, status, words):
    response = client.post("/v1/traces", content=body, headers=headers)
    assert response.status_code == status, response.text
    assert words in response.text
    assert count(client) == 0


def test_a_body_over_the_cap_is_refused_and_nothing_stored(client, settings):
    spans = [span(f"cmpl-{i}", i, **{"padding": "x" * 2000}) for i in range(settings.max_body_bytes // 2000 + 10)]
    response = post(client, export(spans))
    assert response.status_code == 413
    assert count(client) == 0


@pytest.fixture
def secured(settings: Settings, registry, tmp_path) -> TestClient:
    (tmp_path / "tokens").write_text("ingest i-acme tenant=acme instances=acme-0\n")
    tokens = dict(ingest_token="i1", read_token="r1", tokens_file=tmp_path / "tokens")
    with TestClient(create_app(Settings(**(settings.model_dump() | tokens)), registry)) as client:
        yield client


def test_traces_need_the_ingest_token(secured, registry):
    message = export([span("cmpl-a")])
    assert post(secured, message).status_code == 401
    assert post(secured, message, headers={"authorization": "Bearer r1"}).status_code == 403
    assert registry.get_sample_value("specwatch_ingest_rejected_batches_total", {"reason": "unauthorized"}) == 1
    assert post(secured, message, headers={"authorization": "Bearer i1"}).status_code == 200
    read = {"authorization": "Bearer r1"}
    assert secured.get("/v1/requests/cmpl-a", headers=read).json()["record"]["instance"] == "vllm-0"


def test_a_tenant_bound_token_writes_only_its_instances(secured):
    headers = {"authorization": "Bearer i-acme"}
    assert post(secured, export([span("cmpl-a")]), headers=headers).status_code == 403
    mine = export([span("cmpl-b")], {"service.name": "acme-0"})
    assert post(secured, mine, headers=headers).status_code == 200
    record = secured.get("/v1/requests/acme:cmpl-b", headers={"authorization": "Bearer r1"}).json()["record"]
    assert record["tags"]["tenant"] == "acme"


@pytest.mark.parametrize("charset, status", [("latin-1", 415), ("ISO-8859-1", 415), ('"utf-8"', 200), ("UTF8", 200)])
def test_one_charset_rule_for_traces_and_ingest(client, charset, status):
    """Issue 53 #7: OTLP took a latin-1 charset that /v1/ingest refused; both keep one rule now."""
    content_type = {"content-type": f"application/json; charset={charset}"}
    traces = client.post("/v1/traces", content=as_json(export([span("cmpl-a")])), headers=content_type)
    body = b'{"requests": [], "samples": [], "events": []}'
    ingest = client.post("/v1/ingest", content=body, headers=content_type)
    assert (traces.status_code, ingest.status_code) == (status, status)
    if status == 415:
        assert "UTF-8" in traces.json()["detail"]["message"] and "UTF-8" in ingest.json()["detail"]["message"]


def test_spans_past_one_batch_are_a_partial_success(client, monkeypatch):
    """Issue 53 #7: an export of 100,001 spans was refused whole after seconds of work; now the spans one
    ingest batch holds are stored and the rest counted as rejected (OTLP's partial success)."""
    monkeypatch.setattr(otlp, "MAX_RECORDS", 3)
    spans = [span("cmpl-bad", 9, **{"gen_ai.latency.e2e": -1.0})] + [span(f"cmpl-{i}", i) for i in range(4)]
    response = post(client, export(spans))
    assert response.status_code == 200
    partial = answer(response).partial_success
    assert partial.rejected_spans == 2 and "1 llm_request spans past the first 3 of one export" in partial.error_message
    assert "e2e_s" in partial.error_message and count(client) == 3


@pytest.mark.slow
def test_an_export_of_100001_spans_stores_100000(settings, registry):
    body = export([span(f"c{i}", i % 3000) for i in range(MAX_BATCH_RECORDS + 1)]).SerializeToString()
    roomy = Settings(**(settings.model_dump() | {"max_body_bytes": 2 * len(body)}))  # vLLM's spans: ~50 MB
    with TestClient(create_app(roomy, registry)) as client:
        response = client.post("/v1/traces", content=body, headers=PROTOBUF)
        assert response.status_code == 200 and answer(response).partial_success.rejected_spans == 1
