"""Prometheus exposition of what the collector has ingested.

Every metric lives on an injected `CollectorRegistry` (tests use a fresh one). Names carry
the `specwatch_` prefix and base units; labels are bounded (instance, model, mode, drafter),
never per request. Ratios are left to PromQL, e.g. the acceptance rate over 5 minutes:

    sum by (instance) (rate(specwatch_accepted_tokens_total[5m]))
      / sum by (instance) (rate(specwatch_draft_tokens_total[5m]))
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from collector.schema import DeviceSample, RequestRecord
from collector.store import IngestCounts

LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 120.0)
REQUEST_LABELS = ("instance", "model", "mode", "drafter")


class CollectorMetrics:
    """The collector's metrics, registered on `registry`."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self.ingest_records = Counter(
            "specwatch_ingest_records", "Records received by /v1/ingest, by kind and outcome.",
            ("kind", "outcome"), registry=registry,
        )
        self.ingest_rejected = Counter(
            "specwatch_ingest_rejected_batches", "Batches refused by /v1/ingest, by reason.", ("reason",), registry=registry
        )
        self._request_metrics(registry)
        self._device_metrics(registry)
        self._last_sample_at: dict[tuple[str, str], float] = {}

    def _request_metrics(self, registry: CollectorRegistry) -> None:
        def counter(name: str, doc: str) -> Counter:
            return Counter(name, doc, REQUEST_LABELS, registry=registry)

        self.requests = Counter("specwatch_requests", "Finished requests.", (*REQUEST_LABELS, "status"), registry=registry)
        self.drafts = counter("specwatch_drafts", "Draft rounds (target verification passes while drafting).")
        self.draft_tokens = counter("specwatch_draft_tokens", "Tokens proposed by the drafter.")
        self.accepted_tokens = counter("specwatch_accepted_tokens", "Draft tokens accepted by the target.")
        self.output_tokens = counter("specwatch_output_tokens", "Tokens generated.")
        self.ttft = Histogram(
            "specwatch_time_to_first_token_seconds", "Time to first token.", REQUEST_LABELS,
            buckets=LATENCY_BUCKETS, registry=registry,
        )
        self.e2e = Histogram(
            "specwatch_e2e_request_latency_seconds", "End-to-end request latency.", REQUEST_LABELS,
            buckets=LATENCY_BUCKETS, registry=registry,
        )

    def _device_metrics(self, registry: CollectorRegistry) -> None:
        labels = ("instance", "device")
        self.fragmentation = Gauge(
            "specwatch_device_fragmentation_ratio", "Last reported reserved/allocated memory ratio.", labels, registry=registry
        )
        self.power = Gauge("specwatch_device_power_watts", "Last reported device power draw.", labels, registry=registry)
        self.load = Gauge("specwatch_device_load_ratio", "Last reported load of the instance.", labels, registry=registry)
        self.reserved = Gauge(
            "specwatch_device_memory_reserved_bytes", "Last reported reserved device memory.", labels, registry=registry
        )
        self.queue_depth = Gauge("specwatch_device_queue_depth", "Last reported scheduler queue depth.", labels, registry=registry)

    def record_batch(self, counts: IngestCounts) -> None:
        """Account for a stored batch; only the records that were new move the request metrics."""
        for kind, new, dup in (
            ("request", counts.requests, counts.request_duplicates),
            ("sample", counts.samples, counts.sample_duplicates),
            ("event", counts.events, counts.event_duplicates),
        ):
            self.ingest_records.labels(kind, "accepted").inc(new)
            self.ingest_records.labels(kind, "duplicate").inc(dup)
        self._observe_requests(counts.new_requests)
        self._set_device_gauges(counts.new_samples)

    def record_rejected(self, reason: str) -> None:
        self.ingest_rejected.labels(reason).inc()

    def _observe_requests(self, records: Iterable[RequestRecord]) -> None:
        groups: dict[tuple[str, ...], list[RequestRecord]] = defaultdict(list)
        for r in records:
            groups[(r.instance, r.model, r.mode, r.drafter or "none")].append(r)
        for labels, group in groups.items():
            self._observe_group(labels, group)

    def _observe_group(self, labels: tuple[str, ...], group: list[RequestRecord]) -> None:
        statuses: dict[str, int] = defaultdict(int)
        ttft, e2e = self.ttft.labels(*labels), self.e2e.labels(*labels)
        for r in group:
            statuses[r.status] += 1
            e2e.observe(r.e2e_s)
            if r.ttft_s is not None:
                ttft.observe(r.ttft_s)
        for status, n in statuses.items():
            self.requests.labels(*labels, status).inc(n)
        self.drafts.labels(*labels).inc(sum(r.num_drafts for r in group))
        self.draft_tokens.labels(*labels).inc(sum(r.num_draft_tokens for r in group))
        self.accepted_tokens.labels(*labels).inc(sum(r.num_accepted_tokens for r in group))
        self.output_tokens.labels(*labels).inc(sum(r.output_tokens for r in group))

    def _set_device_gauges(self, samples: Iterable[DeviceSample]) -> None:
        for s in samples:
            labels = (s.instance, s.device)
            if s.at < self._last_sample_at.get(labels, float("-inf")):
                continue  # a late (e.g. replayed) reading must not overwrite a newer one
            self._last_sample_at[labels] = s.at
            self.reserved.labels(*labels).set(s.mem_reserved_bytes)
            self.queue_depth.labels(*labels).set(s.queue_depth)
            for gauge, value in ((self.fragmentation, s.fragmentation), (self.power, s.power_w), (self.load, s.load)):
                if value is not None:
                    gauge.labels(*labels).set(value)
