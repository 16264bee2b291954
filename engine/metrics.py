"""Prometheus exposition of the engine (`GET /metrics`), vLLM-like names under `specwatch_engine_`.

Counters move once per finished request (off the decoding loop); ratios are PromQL:

    acceptance rate        = rate(specwatch_engine_spec_decode_num_accepted_tokens_total[5m])
                           / rate(specwatch_engine_spec_decode_num_draft_tokens_total[5m])
    mean acceptance length = 1 + rate(..._num_accepted_tokens_total[5m]) / rate(..._num_drafts_total[5m])
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from specwatch.engine.refusals import REASONS, REFUSED
from specwatch.telemetry.client import TelemetryClient
from specwatch.telemetry.schema import LATENCY_BUCKETS, RequestRecord

TPOT_BUCKETS = (0.005, 0.01, 0.02, 0.03, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.5, 1.0)


class EngineMetrics:
    def __init__(self, scheduler, registry: CollectorRegistry) -> None:
        prefix = "specwatch_engine"
        self.requests = Counter(f"{prefix}_requests", "Finished requests.", ["mode", "status"], registry=registry)
        self.refused = Counter(
            f"{prefix}_requests_refused", "Requests refused before they ran, by reason.", ["reason"], registry=registry
        )
        for reason in REASONS:  # every reason shows from the start, at 0
            self.refused.labels(reason)
        self.output_tokens = Counter(f"{prefix}_output_tokens", "Generated tokens.", ["mode"], registry=registry)
        self.drafts = Counter(f"{prefix}_spec_decode_num_drafts", "Draft rounds.", ["drafter"], registry=registry)
        self.draft_tokens = Counter(
            f"{prefix}_spec_decode_num_draft_tokens", "Drafted tokens.", ["drafter"], registry=registry
        )
        self.accepted = Counter(
            f"{prefix}_spec_decode_num_accepted_tokens", "Accepted draft tokens.", ["drafter"], registry=registry
        )
        self.per_position = Counter(
            f"{prefix}_spec_decode_num_accepted_tokens_per_pos",
            "Accepted draft tokens by position.",
            ["drafter", "position"],
            registry=registry,
        )
        self.ttft = Histogram(
            f"{prefix}_time_to_first_token_seconds",
            "Time to first token.",
            ["mode"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.e2e = Histogram(
            f"{prefix}_e2e_request_latency_seconds",
            "End-to-end request latency.",
            ["mode"],
            buckets=LATENCY_BUCKETS,
            registry=registry,
        )
        self.tpot = Histogram(
            f"{prefix}_time_per_output_token_seconds",
            "Mean time per output token after the first.",
            ["mode"],
            buckets=TPOT_BUCKETS,
            registry=registry,
        )
        Gauge(f"{prefix}_num_requests_running", "Requests decoding.", registry=registry).set_function(
            lambda: scheduler.active
        )
        Gauge(f"{prefix}_num_requests_waiting", "Requests queued.", registry=registry).set_function(
            lambda: scheduler.queue_depth
        )
        Gauge(f"{prefix}_load", "(running + waiting) / slots.", registry=registry).set_function(lambda: scheduler.load)
        Gauge(
            f"{prefix}_speculation_enabled",
            "1 while load allows speculation and no override disables it.",
            registry=registry,
        ).set_function(lambda: _speculation_enabled(scheduler.policy.state))
        if scheduler.sink.client is not None:
            _telemetry_gauges(scheduler.sink.client, registry)

    def observe(self, record: RequestRecord) -> None:
        if record.error and record.error.startswith(REFUSED):  # never ran: counted apart (engine/refusals.py)
            self.refused.labels(record.error[len(REFUSED) :]).inc()
            return
        self.requests.labels(record.mode, record.status).inc()
        self.output_tokens.labels(record.mode).inc(record.output_tokens)
        self.e2e.labels(record.mode).observe(record.e2e_s)
        if record.ttft_s is not None:
            self.ttft.labels(record.mode).observe(record.ttft_s)
            if record.output_tokens > 1:
                self.tpot.labels(record.mode).observe((record.e2e_s - record.ttft_s) / (record.output_tokens - 1))
        if record.drafter and record.num_drafts:
            self._observe_drafts(record)

    def _observe_drafts(self, record: RequestRecord) -> None:
        drafter = record.drafter
        self.drafts.labels(drafter).inc(record.num_drafts)
        self.draft_tokens.labels(drafter).inc(record.num_draft_tokens)
        self.accepted.labels(drafter).inc(record.num_accepted_tokens)
        for position, count in enumerate(record.accepted_per_position):
            self.per_position.labels(drafter, str(position)).inc(count)


def _telemetry_gauges(client: TelemetryClient, registry: CollectorRegistry) -> None:
    """The telemetry client's health: a wrong or missing collector token shows here, not only in the log."""
    Gauge(
        "specwatch_telemetry_auth_failing",
        "1 while the collector refuses the ingest token (401/403); telemetry waits in the spool.",
        registry=registry,
    ).set_function(lambda: float(client.stats().auth_failing))
    Gauge("specwatch_telemetry_spool_bytes", "Telemetry waiting in the disk spool.", registry=registry).set_function(
        lambda: client.stats().spool_bytes
    )


def _speculation_enabled(state: dict) -> float:
    if state["override"] != "auto":
        return float(state["override"] == "speculative")
    return float(state["load_allows_speculation"])
