"""A stand-in for vLLM's /metrics: the same metric names, help texts, labels and buckets as
vLLM v1 (vllm/v1/metrics/loggers.py, vllm/v1/spec_decode/metrics.py), produced by the same
library (prometheus_client), so the exposition, `_created` series included, is vLLM's."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

TTFT_BUCKETS = [
    0.001,
    0.005,
    0.01,
    0.02,
    0.04,
    0.06,
    0.08,
    0.1,
    0.25,
    0.5,
    0.75,
    1.0,
    2.5,
    5.0,
    7.5,
    10.0,
    20.0,
    40.0,
    80.0,
    160.0,
    640.0,
    2560.0,
]
E2E_BUCKETS = [
    0.3,
    0.5,
    0.8,
    1.0,
    1.5,
    2.0,
    2.5,
    5.0,
    10.0,
    15.0,
    20.0,
    30.0,
    40.0,
    50.0,
    60.0,
    120.0,
    240.0,
    480.0,
    960.0,
    1920.0,
    7680.0,
]
LABELS = ["model_name", "engine"]


class FakeVllm:
    """One vLLM process; a new instance is a restarted vLLM (counters from zero, new _created)."""

    def __init__(
        self,
        model: str = "HuggingFaceTB/SmolLM2-135M-Instruct",
        engines: int = 1,
        gamma: int = 3,
        speculative: bool = True,
    ) -> None:
        """`speculative=False`: a vLLM without a speculative config, which registers no spec-decode family."""
        self.registry = CollectorRegistry()
        self.gamma, r = gamma, self.registry
        Gauge("vllm:num_requests_running", "Number of requests in model execution batches.", LABELS, registry=r)
        self.generated = Counter("vllm:generation_tokens", "Number of generation tokens processed.", LABELS, registry=r)
        if not speculative:
            r = CollectorRegistry()  # the spec-decode families below go nowhere
        self.drafts = Counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", LABELS, registry=r)
        self.draft_tokens = Counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", LABELS, registry=r)
        self.accepted = Counter(
            "vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", LABELS, registry=r
        )
        self.per_pos = Counter(
            "vllm:spec_decode_num_accepted_tokens_per_pos",
            "Accepted tokens per draft position.",
            LABELS + ["position"],
            registry=r,
        )
        self.ttft = Histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            LABELS,
            buckets=TTFT_BUCKETS,
            registry=self.registry,
        )
        self.e2e = Histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            LABELS,
            buckets=E2E_BUCKETS,
            registry=self.registry,
        )
        self.labelsets = [[model, str(i)] for i in range(engines)]
        for lv in self.labelsets:  # vLLM creates every child up front, so zeros are exposed
            for metric in (self.generated, self.drafts, self.draft_tokens, self.accepted, self.ttft, self.e2e):
                metric.labels(*lv)
            for pos in range(gamma):
                self.per_pos.labels(*lv, str(pos))

    def observe_draft(self, accepted: int, engine: int = 0) -> None:
        """One draft of `gamma` tokens of which the first `accepted` were accepted (SpecDecodingStats)."""
        lv = self.labelsets[engine]
        self.drafts.labels(*lv).inc()
        self.draft_tokens.labels(*lv).inc(self.gamma)
        self.accepted.labels(*lv).inc(accepted)
        self.generated.labels(*lv).inc(accepted + 1)  # the accepted tokens and the target's own
        for pos in range(accepted):
            self.per_pos.labels(*lv, str(pos)).inc()

    def observe_plain_steps(self, steps: int, engine: int = 0) -> None:
        """Decode steps without a draft (k = 0): one token each, and no spec-decode counter moves."""
        self.generated.labels(*self.labelsets[engine]).inc(steps)

    def observe_request(self, ttft: float, e2e: float, engine: int = 0) -> None:
        self.ttft.labels(*self.labelsets[engine]).observe(ttft)
        self.e2e.labels(*self.labelsets[engine]).observe(e2e)

    def text(self) -> str:
        return generate_latest(self.registry).decode()
