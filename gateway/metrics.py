"""The gateway's own /metrics: requests by upstream and outcome, and each upstream's health and load.

specwatch_gateway_requests_total{upstream, mode, status}
specwatch_gateway_request_seconds{upstream}   e2e latency at the gateway (histogram)
specwatch_gateway_upstream_up{upstream, pool} 1 healthy, 0 down
specwatch_gateway_upstream_load{upstream}     (running + waiting) / capacity
specwatch_gateway_upstream_in_flight{upstream}
specwatch_gateway_clamped_counts_total{upstream} records whose engine-reported accepted count was impossible,
                                               clamped and tagged `spec_clamped` (telemetry.clamps)
specwatch_gateway_unknown_draft_counts_total{upstream, reason} speculative requests answered ok whose draft
                                               counts are unknown (stored as unknown, never guessed), by why
                                               (gateway.vllm_metrics.REASONS; `untagged` when no tag fit)
"""

from __future__ import annotations

from collections.abc import Mapping

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

from specwatch.gateway.upstreams import UpstreamState
from specwatch.gateway.vllm_metrics import UNKNOWN_TAG
from specwatch.telemetry.clamps import CLAMPED_TAG
from specwatch.telemetry.schema import LATENCY_BUCKETS, RequestRecord


class GatewayMetrics:
    def __init__(self, states: Mapping[str, UpstreamState], registry: CollectorRegistry) -> None:
        prefix = "specwatch_gateway"
        self.requests = Counter(
            f"{prefix}_requests", "Proxied requests.", ["upstream", "mode", "status"], registry=registry
        )
        self.latency = Histogram(
            f"{prefix}_request_seconds",
            "End-to-end latency at the gateway.",
            ["upstream"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.clamped = Counter(
            f"{prefix}_clamped_counts",
            "Records whose engine-reported accepted count was impossible, clamped and tagged spec_clamped.",
            ["upstream"],
            registry=registry,
        )
        self.unknown_counts = Counter(
            f"{prefix}_unknown_draft_counts",
            "Speculative requests answered ok whose draft counts are unknown (stored as unknown), by why.",
            ["upstream", "reason"],
            registry=registry,
        )
        registry.register(_UpstreamGauges(states))

    def observe(self, record: RequestRecord) -> None:
        """A finished request (a consumer of the gateway's sink)."""
        self.requests.labels(record.instance, record.mode, record.status).inc()
        self.latency.labels(record.instance).observe(record.e2e_s)
        if CLAMPED_TAG in record.tags:
            self.clamped.labels(record.instance).inc()
        if record.mode == "speculative" and record.status == "ok" and not record.draft_counts_known:
            self.unknown_counts.labels(record.instance, record.tags.get(UNKNOWN_TAG, "untagged")).inc()


class _UpstreamGauges:
    """Read at scrape time from the live upstream states."""

    def __init__(self, states: Mapping[str, UpstreamState]) -> None:
        self.states = states

    def collect(self):
        up = GaugeMetricFamily(
            "specwatch_gateway_upstream_up", "1 while the upstream is healthy.", labels=["upstream", "pool"]
        )
        load = GaugeMetricFamily(
            "specwatch_gateway_upstream_load", "(running + waiting) / capacity.", labels=["upstream"]
        )
        in_flight = GaugeMetricFamily(
            "specwatch_gateway_upstream_in_flight", "Requests the gateway has open there.", labels=["upstream"]
        )
        for name, state in self.states.items():
            up.add_metric([name, state.upstream.pool], 1.0 if state.healthy else 0.0)
            load.add_metric([name], state.load)
            in_flight.add_metric([name], state.in_flight)
        return [up, load, in_flight]
