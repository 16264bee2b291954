"""Upstream-health snapshots from a real `gateway.core.Gateway.emit_upstreams` (no network), for the
Sources tests: gateway "edge" with upstreams vllm-a (spec, ngram) and vllm-b (plain)."""

from __future__ import annotations

from specwatch.gateway.core import Gateway, GatewaySettings
from specwatch.gateway.routing import Router, RoutingConfig
from specwatch.gateway.upstreams import Upstream
from specwatch.telemetry.schema import EngineEvent
from specwatch.telemetry.sink import TelemetrySink


def upstream_snapshots(ats: list[float]) -> list[EngineEvent]:
    """Up to three snapshots at `ats`: both upstreams up; vllm-b down ('connect: connection refused');
    vllm-b up again."""
    sink, events = TelemetrySink("edge"), []
    sink.subscribe(EngineEvent, events.append)  # where the collector's client would queue them
    upstreams = [
        Upstream("vllm-a", "http://10.0.0.1:8000", drafter="ngram", gamma=4, pool="spec"),
        Upstream("vllm-b", "http://10.0.0.2:8000", pool="plain"),
    ]
    gateway = Gateway(upstreams, Router(RoutingConfig()), GatewaySettings(name="edge"), sink)
    gateway.emit_upstreams()
    gateway.states["vllm-b"].mark_down("connect: connection refused")
    gateway.emit_upstreams()
    gateway.states["vllm-b"].mark_up()
    gateway.emit_upstreams()
    return [e.model_copy(update={"at": at}) for e, at in zip(events, ats)]
