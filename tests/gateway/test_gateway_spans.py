"""Spans out across nodes: a client's traceparent -> the gateway's span -> the engine's span, its child.

The bundled engine runs speculatively behind a real gateway (real HTTP between them). One test reads
the spans back from the SDK's in-memory exporter; the other sends them over OTLP/HTTP protobuf to a
real receiver, Arize Phoenix (its own venv, .venv-phoenix: see docs/otlp.md), and reads them back from
Phoenix's REST API. Skipped with the reason when .venv-phoenix is absent."""

from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest
from engine_harness import BackgroundServer
from gateway_harness import GatewayServer
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from waiting import wait_for

from specwatch.common.procs import free_port, start_service, stop_process
from specwatch.engine.policy import PolicyConfig
from specwatch.engine.scheduler import SchedulerConfig
from specwatch.telemetry.sink import TelemetrySink
from specwatch.telemetry.spans import RequestSpans

CLIENT_TRACE, CLIENT_SPAN = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
HEADERS = {"traceparent": f"00-{CLIENT_TRACE}-{CLIENT_SPAN}-01"}
REPEAT = "Repeat exactly: the quick brown fox jumps over the lazy dog. the quick brown fox jumps over the lazy dog."
PHOENIX = Path(__file__).resolve().parents[2] / ".venv-phoenix" / "bin" / "phoenix"


def traced_pair(bundled_engine, engine_spans: RequestSpans, gateway_spans: RequestSpans):
    """(engine, gateway): the bundled engine drafting with n-gram, a gateway in front, each with its spans."""
    sink = TelemetrySink("engine1", spans=engine_spans)
    engine = BackgroundServer(bundled_engine, SchedulerConfig(slots=2), PolicyConfig(min_acceptance=0.0), sink)
    return engine, lambda: GatewayServer([f"spec1={engine.url},drafter=ngram,gamma=8"], spans=gateway_spans)


def ask(gateway_url: str, model: str, stream: bool) -> None:
    body = {"model": model, "messages": [{"role": "user", "content": REPEAT}], "max_tokens": 24, "temperature": 0}
    response = httpx.post(f"{gateway_url}/v1/chat/completions", json={**body, "stream": stream}, headers=HEADERS)
    assert response.status_code == 200, response.text


def test_the_engine_span_is_the_child_of_the_gateway_span_which_continues_the_client(bundled_engine):
    engine_out, gateway_out = InMemorySpanExporter(), InMemorySpanExporter()
    gateway_spans = RequestSpans("specwatch-gw", gateway_out)
    engine, gateway = traced_pair(bundled_engine, RequestSpans("specwatch-engine", engine_out), gateway_spans)
    with engine, gateway() as gw:
        for stream in (False, True):
            ask(gw.url, bundled_engine.target.name, stream)
        gw.wait_records(2)
    # the servers' exits exported what their batch processors held
    for outer, inner in zip(gateway_out.get_finished_spans(), engine_out.get_finished_spans(), strict=True):
        assert format(outer.context.trace_id, "032x") == CLIENT_TRACE == format(inner.context.trace_id, "032x")
        assert format(outer.parent.span_id, "016x") == CLIENT_SPAN
        assert inner.parent.span_id == outer.context.span_id  # across the HTTP hop
        for span in (outer, inner):
            assert span.attributes["specwatch.spec.drafter"] == "ngram"
            assert span.attributes["specwatch.spec.draft_tokens"] > 0
        for key in ("gen_ai.usage.output_tokens", "specwatch.spec.accepted_tokens", "gen_ai.request.id"):
            assert outer.attributes[key] == inner.attributes[key], key
        assert outer.resource.attributes["service.name"] == "specwatch-gw"


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory):
    """A Phoenix server on free loopback ports: its base URL."""
    if not PHOENIX.exists():
        pytest.skip(f"no Phoenix at {PHOENIX} (python3.11 -m venv .venv-phoenix; pip install arize-phoenix there)")
    home, port = tmp_path_factory.mktemp("phoenix"), free_port()
    env = {
        **os.environ,
        "PHOENIX_WORKING_DIR": str(home),
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(free_port()),
    }
    ready = f"http://127.0.0.1:{port}/healthz"
    process = start_service("Phoenix", [str(PHOENIX), "serve"], env, home / "log", ready, 120)
    yield f"http://127.0.0.1:{port}"
    stop_process(process)


def test_phoenix_receives_the_gateway_span_and_its_engine_child(bundled_engine, phoenix, monkeypatch):
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", phoenix)  # the standard variable, read by the SDK
    engine_spans, gateway_spans = RequestSpans.from_env("specwatch-engine"), RequestSpans.from_env("specwatch-gw")
    engine, gateway = traced_pair(bundled_engine, engine_spans, gateway_spans)
    with engine, gateway() as gw:
        ask(gw.url, bundled_engine.target.name, stream=True)
        gw.wait_records(1)
    url = f"{phoenix}/v1/projects/default/spans"
    spans = wait_for(lambda: _two(httpx.get(url, params={"trace_id": CLIENT_TRACE}).json()["data"]), "two spans")
    (outer,) = [s for s in spans if s["parent_id"] == CLIENT_SPAN]
    (inner,) = [s for s in spans if s["parent_id"] == outer["context"]["span_id"]]
    for span in (outer, inner):
        attributes = span["attributes"]
        assert attributes["gen_ai.operation.name"] == "chat" and attributes["specwatch.spec.mode"] == "speculative"
        assert attributes["specwatch.spec.accepted_tokens"] == sum(attributes["specwatch.spec.accepted_per_position"])
        assert 0 <= attributes["specwatch.spec.acceptance_rate"] <= 1 and attributes["gen_ai.usage.output_tokens"] > 0
    instances = outer["attributes"]["specwatch.instance"], inner["attributes"]["specwatch.instance"]
    assert instances == ("spec1", bundled_engine.config.instance)  # the upstream's name, the engine's own


def _two(spans: list[dict]) -> list[dict] | None:
    return spans if len(spans) == 2 else None
