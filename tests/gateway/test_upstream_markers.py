"""Deploy markers for upstreams, through the real gateway in front of a fake vLLM (real HTTP): a config
event with the upstream's name as instance when first seen, none while nothing changes, one when its
/version or its speculative config (draft positions of /metrics) changes after a restart."""

from __future__ import annotations

import time

from fake_vllm import FakeVllm
from gateway_harness import GatewayServer
from starlette.applications import Starlette
from starlette.responses import JSONResponse, PlainTextResponse, Response
from starlette.routing import Route
from thread_server import ThreadServer

from specwatch.gateway.markers import data_parallel_ranks, draft_positions, speculative_settings
from specwatch.telemetry.schema import EngineEvent


def fake_vllm_app() -> Starlette:
    """vLLM's /health, /version, /v1/models and /metrics; `app.state` says what they answer (`up`: False
    refuses /health with 503, as a restarting server does)."""

    def health(request):
        return Response(status_code=200 if request.app.state.up else 503)

    def version(request):
        return JSONResponse({"version": request.app.state.version})

    def models(request):
        return JSONResponse({"object": "list", "data": [{"id": "smollm2", "object": "model", "max_model_len": 2048}]})

    def metrics(request):
        return PlainTextResponse(request.app.state.vllm.text())

    routes = [Route("/health", health), Route("/version", version), Route("/v1/models", models)]
    app = Starlette(routes=[*routes, Route("/metrics", metrics)])
    app.state.up, app.state.version, app.state.vllm = True, "0.32.0", FakeVllm(gamma=3)
    return app


def wait_markers(events: list, n: int, timeout_s: float = 10.0) -> list[EngineEvent]:
    deadline = time.monotonic() + timeout_s

    def markers() -> list[EngineEvent]:  # the gateway's own config event (its routing) aside
        return [e for e in events if e.kind == "config" and e.detail.get("role") == "upstream"]

    while len(markers()) < n and time.monotonic() < deadline:
        time.sleep(0.05)
    return markers()


def test_markers_on_first_sight_and_on_each_change():
    app = fake_vllm_app()
    with ThreadServer(app) as upstream:
        gateway = GatewayServer([f"vllm-a={upstream.url},drafter=ngram"])
        events: list[EngineEvent] = []
        gateway.gateway.sink.subscribe(EngineEvent, events.append)
        with gateway:
            (first,) = wait_markers(events, 1)
            assert first.instance == "vllm-a"
            assert first.detail["version"] == "0.32.0" and first.detail["num_speculative_tokens"] == 3
            assert first.detail["model"] == "smollm2" and first.detail["role"] == "upstream"
            app.state.up = False  # a restart: down, then back on another version with k = 5
            time.sleep(1.0)
            app.state.version, app.state.vllm, app.state.up = "0.33.0", FakeVllm(gamma=5), True
            markers = wait_markers(events, 2)
            time.sleep(1.0)  # health checks go on every 0.2 s: nothing new to record
    assert len(wait_markers(events, 3, 0)) == 2
    assert (markers[1].detail["version"], markers[1].detail["num_speculative_tokens"]) == ("0.33.0", 5)


def test_identity_pieces():
    assert draft_positions(FakeVllm(gamma=4).text()) == 4
    assert draft_positions("vllm:num_requests_running 0\n") == 0
    assert data_parallel_ranks(FakeVllm(engines=2).text()) == 2  # one `engine` label value per rank
    assert data_parallel_ranks(FakeVllm().text()) == 1 and data_parallel_ranks("not {an exposition") == 0
    card = {"id": "m", "speculative_config": {"method": "ngram", "num_speculative_tokens": 4}, "root": "m"}
    assert speculative_settings(card) == {"speculative_config": {"method": "ngram", "num_speculative_tokens": 4}}
