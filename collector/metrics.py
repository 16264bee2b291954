"""Prometheus exposition of what the collector has ingested.

Every metric lives on an injected `CollectorRegistry` (tests use a fresh one). Names carry
the `specwatch_` prefix and base units; labels are bounded (instance, model, mode, drafter),
never per request. Ratios are left to PromQL, e.g. the acceptance rate over 5 minutes:

    sum by (instance) (rate(specwatch_accepted_tokens_total[5m]))
      / sum by (instance) (rate(specwatch_draft_tokens_total[5m]))

The spread of per-request acceptance (the `acceptance_stddev` alert) from its moments:

    sqrt(rate(specwatch_acceptance_rate_squares_total[5m]) / rate(specwatch_acceptance_rate_requests_total[5m])
         - (rate(specwatch_acceptance_rate_sum_total[5m]) / rate(specwatch_acceptance_rate_requests_total[5m])) ^ 2)

Per-request metrics are accumulated in numpy per label set and exposed by a custom
collector: `Histogram.observe` per record cost more than parsing the record on ingest.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterable, Iterator

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, HistogramMetricFamily, Metric

from collector.models import LATENCY_BUCKETS
from collector.schema import DeviceSample, RequestRecord
from collector.store import IngestCounts

REQUEST_LABELS = ("instance", "model", "mode", "drafter")
ARM_LABELS = ("instance", "model", "arm")
_SUMS = ("drafts", "draft_tokens", "accepted_tokens", "output_tokens")
_SUM_FIELDS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "output_tokens")
_SUM_DOCS = {
    "drafts": "Draft rounds (target verification passes while drafting).",
    "draft_tokens": "Tokens proposed by the drafter.",
    "accepted_tokens": "Draft tokens accepted by the target.",
    "output_tokens": "Tokens generated.",
    "acceptance_rate_requests": "Requests that drafted (the count behind the acceptance-rate moments).",
    "acceptance_rate_sum": "Sum over requests that drafted of each one's accepted / draft tokens.",
    "acceptance_rate_squares": "Sum over requests that drafted of each one's (accepted / draft tokens) squared.",
    # Only requests: IngestCounts carries no new EngineEvents, so `oom` events are not counted here.
    "oom_errors": "Requests whose error names an out-of-memory failure (e.g. draft:oom).",
}
_ARM_DOCS = {
    "arm_requests": "Ok requests with output under a canary / A-B arm.",
    "arm_e2e_seconds_per_token": "Sum over those requests of e2e latency / output tokens; / arm_requests = the mean.",
}
_HISTOGRAMS = {
    "ttft": ("specwatch_time_to_first_token_seconds", "Time to first token."),
    "e2e": ("specwatch_e2e_request_latency_seconds", "End-to-end request latency."),
}


class _LabelStats:
    """Running totals for one label set."""

    def __init__(self) -> None:
        self.status: dict[str, int] = defaultdict(int)
        self.sums: dict[str, float] = dict.fromkeys(_SUM_DOCS, 0)
        self.buckets = {name: np.zeros(len(LATENCY_BUCKETS) + 1, dtype=np.int64) for name in _HISTOGRAMS}
        self.value_sums = dict.fromkeys(_HISTOGRAMS, 0.0)


class RequestMetrics:
    """Counters and latency histograms of stored requests, by instance/model/mode/drafter."""

    def __init__(self) -> None:
        self._stats: dict[tuple[str, ...], _LabelStats] = {}
        self._arms: dict[tuple[str, ...], dict[str, float]] = {}  # (instance, model, arm) -> _ARM_DOCS totals
        self._lock = threading.Lock()
        self._bounds = np.array(LATENCY_BUCKETS)

    def observe(self, records: Iterable[RequestRecord]) -> None:
        groups: dict[tuple[str, ...], list[RequestRecord]] = defaultdict(list)
        for r in records:
            groups[(r.instance, r.model, r.mode, r.drafter or "none")].append(r)
        with self._lock:
            for labels, group in groups.items():
                self._observe_group(self._stats.setdefault(labels, _LabelStats()), group)
                self._observe_arms(group)

    def _observe_arms(self, group: list[RequestRecord]) -> None:
        """The requests `spec_latency_regression` compares: ok, with output, under an arm."""
        for r in group:
            if r.arm is not None and r.status == "ok" and r.output_tokens > 0:
                arm = self._arms.setdefault((r.instance, r.model, r.arm), dict.fromkeys(_ARM_DOCS, 0))
                arm["arm_requests"] += 1
                arm["arm_e2e_seconds_per_token"] += r.e2e_s / r.output_tokens

    def _observe_group(self, stats: _LabelStats, group: list[RequestRecord]) -> None:
        for r in group:
            stats.status[r.status] += 1
        for name, field in zip(_SUMS, _SUM_FIELDS):
            stats.sums[name] += sum(getattr(r, field) for r in group)
        rates = np.array([r.num_accepted_tokens / r.num_draft_tokens for r in group if r.num_draft_tokens], dtype=float)
        stats.sums["acceptance_rate_requests"] += len(rates)
        stats.sums["acceptance_rate_sum"] += float(rates.sum())
        stats.sums["acceptance_rate_squares"] += float(np.square(rates).sum())
        stats.sums["oom_errors"] += sum(1 for r in group if r.error and "oom" in r.error)
        for name, values in (("e2e", [r.e2e_s for r in group]), ("ttft", [r.ttft_s for r in group if r.ttft_s is not None])):
            array = np.array(values, dtype=float)
            # bucket i holds bounds[i-1] < v <= bounds[i]; the last one is +Inf
            stats.buckets[name] += np.bincount(np.searchsorted(self._bounds, array, side="left"), minlength=len(self._bounds) + 1)
            stats.value_sums[name] += float(array.sum())

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            items = [(labels, s.status.copy(), s.sums.copy(), {k: v.copy() for k, v in s.buckets.items()}, s.value_sums.copy())
                     for labels, s in self._stats.items()]
            arms = [(labels, totals.copy()) for labels, totals in self._arms.items()]
        requests = CounterMetricFamily("specwatch_requests", "Finished requests.", labels=[*REQUEST_LABELS, "status"])
        sums = {n: CounterMetricFamily(f"specwatch_{n}", doc, labels=REQUEST_LABELS) for n, doc in _SUM_DOCS.items()}
        hists = {n: HistogramMetricFamily(metric, doc, labels=REQUEST_LABELS) for n, (metric, doc) in _HISTOGRAMS.items()}
        for labels, status, totals, buckets, value_sums in items:
            for s, n in status.items():
                requests.add_metric([*labels, s], n)
            for n, family in sums.items():
                family.add_metric(list(labels), totals[n])
            for n, family in hists.items():
                cumulative = np.cumsum(buckets[n])
                edges = [*(repr(float(b)) for b in LATENCY_BUCKETS), "+Inf"]
                family.add_metric(list(labels), list(zip(edges, (int(c) for c in cumulative))), value_sums[n])
        yield requests
        yield from sums.values()
        yield from hists.values()
        yield from self._arm_families(arms)

    @staticmethod
    def _arm_families(arms: list[tuple[tuple[str, ...], dict[str, float]]]) -> Iterator[Metric]:
        for name, doc in _ARM_DOCS.items():
            family = CounterMetricFamily(f"specwatch_{name}", doc, labels=ARM_LABELS)
            for labels, totals in arms:
                family.add_metric(list(labels), totals[name])
            yield family


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
        self.requests = RequestMetrics()
        registry.register(self.requests)
        self._device_metrics(registry)
        self._last_sample_at: dict[tuple[str, str], float] = {}

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
        self.util_draft = Gauge(
            "specwatch_device_util_draft_ratio", "Last reported busy fraction of the draft model.", labels, registry=registry
        )

    def record_batch(self, counts: IngestCounts) -> None:
        """Account for a stored batch; only the records that were new move the request metrics."""
        for kind, new, dup in (
            ("request", counts.requests, counts.request_duplicates),
            ("sample", counts.samples, counts.sample_duplicates),
            ("event", counts.events, counts.event_duplicates),
        ):
            self.ingest_records.labels(kind, "accepted").inc(new)
            self.ingest_records.labels(kind, "duplicate").inc(dup)
        self.requests.observe(counts.new_requests)
        self._set_device_gauges(counts.new_samples)

    def record_rejected(self, reason: str) -> None:
        self.ingest_rejected.labels(reason).inc()

    def _set_device_gauges(self, samples: Iterable[DeviceSample]) -> None:
        for s in samples:
            labels = (s.instance, s.device)
            if s.at < self._last_sample_at.get(labels, float("-inf")):
                continue  # a late (e.g. replayed) reading must not overwrite a newer one
            self._last_sample_at[labels] = s.at
            self.reserved.labels(*labels).set(s.mem_reserved_bytes)
            self.queue_depth.labels(*labels).set(s.queue_depth)
            for gauge, value in ((self.fragmentation, s.fragmentation), (self.power, s.power_w), (self.load, s.load),
                                 (self.util_draft, s.util_draft)):
                if value is not None:
                    gauge.labels(*labels).set(value)
