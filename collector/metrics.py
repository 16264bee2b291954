"""Prometheus exposition of what the collector has ingested.

Every metric lives on an injected `CollectorRegistry` (tests use a fresh one). Names carry
the `specwatch_` prefix and base units; labels are bounded (instance, model, mode, drafter),
never per request. Ratios are left to PromQL, e.g. the acceptance rate over 5 minutes:

    sum by (instance) (rate(specwatch_accepted_tokens_total[5m]))
      / sum by (instance) (rate(specwatch_draft_tokens_total[5m]))

Device seconds per output token of one mode (the `spec_cost_excess` alert divides speculative by
autoregressive):

    sum by (instance) (rate(specwatch_device_seconds_total{mode="speculative"}[1h]))
      / sum by (instance) (rate(specwatch_device_timed_output_tokens_total{mode="speculative"}[1h]))

The spread of per-request acceptance (the `acceptance_stddev` alert) from its moments:

    sqrt(rate(specwatch_acceptance_rate_squares_total[5m]) / rate(specwatch_acceptance_rate_requests_total[5m])
         - (rate(specwatch_acceptance_rate_sum_total[5m]) / rate(specwatch_acceptance_rate_requests_total[5m])) ^ 2)

Per-request metrics are accumulated in numpy per label set and exposed by a custom
collector: `Histogram.observe` per record cost more than parsing the record on ingest.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter as Tally
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator
from operator import itemgetter

import numpy as np
from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from sqlalchemy.exc import SQLAlchemyError

from specwatch.collector.ingest.store import IngestCounts
from specwatch.collector.label_budget import FOLD_CAPS, LabelBudget, LabelLimits, Labels
from specwatch.collector.reads.capacity import Capacity, CapacityRules, upstream_capacity
from specwatch.telemetry.schema import LATENCY_BUCKETS, DeviceSample, RequestRecord

REQUEST_LABELS = ("instance", "model", "mode", "drafter")
ARM_LABELS = ("instance", "model", "arm")
_SUMS = ("drafts", "draft_tokens", "accepted_tokens", "output_tokens")
_SUM_FIELDS = ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "output_tokens")
_SUM_DOCS = {
    "drafts": "Draft rounds (target verification passes while drafting).",
    "draft_tokens": "Tokens proposed by the drafter.",
    "accepted_tokens": "Draft tokens accepted by the target.",
    # conditional acceptance (position 0) = this / drafts: the first token of a draft accepted
    "first_position_accepted": "Drafts whose first token was accepted (accepted_per_position[0]).",
    "output_tokens": "Tokens generated.",
    "acceptance_rate_requests": "Requests that drafted (the count behind the acceptance-rate moments).",
    "acceptance_rate_sum": "Sum over requests that drafted of each one's accepted / draft tokens.",
    "acceptance_rate_squares": "Sum over requests that drafted of each one's (accepted / draft tokens) squared.",
    # Only requests: IngestCounts carries no new EngineEvents, so `oom` events are not counted here.
    "oom_errors": "Requests whose error names an out-of-memory failure (e.g. draft:oom).",
    # The spec_cost_excess alert: device seconds per output token of ok requests that carry device_s.
    "device_timed_requests": "Ok requests with output that report device_s (attributed device time).",
    "device_seconds": "Sum of device_s (attributed device busy seconds) over those requests.",
    "device_timed_output_tokens": "Output tokens of those requests; device_seconds / this = device-s per token.",
}
_ARM_DOCS = {
    "arm_requests": "Ok requests with output under a canary / A-B arm.",
    "arm_e2e_seconds_per_token": "Sum over those requests of e2e latency / output tokens; / arm_requests = the mean.",
}
# What the request metrics read from a record: the four labels first, then the summed fields.
_ROW_FIELDS = (
    *REQUEST_LABELS,
    *("tags", "status", "arm", "error", "e2e_s", "ttft_s", "device_s", "accepted_per_position", *_SUM_FIELDS),
)
_read_row = itemgetter(*_ROW_FIELDS)  # from a record's __dict__: much faster than attribute access
_HISTOGRAMS = {
    "ttft": ("specwatch_time_to_first_token_seconds", "Time to first token."),
    "e2e": ("specwatch_e2e_request_latency_seconds", "End-to-end request latency."),
}


class _LabelStats:
    """Running totals for one label set."""

    def __init__(self) -> None:
        self.status: Tally[str] = Tally()
        self.sums: dict[str, float] = dict.fromkeys(_SUM_DOCS, 0)
        self.buckets = {name: np.zeros(len(LATENCY_BUCKETS) + 1, dtype=np.int64) for name in _HISTOGRAMS}
        self.value_sums = dict.fromkeys(_HISTOGRAMS, 0.0)

    def add(self, other: _LabelStats) -> None:
        self.status.update(other.status)
        for name, value in other.sums.items():
            self.sums[name] += value
        for name, counts in other.buckets.items():
            self.buckets[name] += counts
            self.value_sums[name] += other.value_sums[name]


_BOUNDS = np.array(LATENCY_BUCKETS)


class RequestTotals:
    """What a set of stored requests adds to the request metrics, per label set and tenant.

    An ingest worker process sums its batch's new records into one of these, which is small
    and picklable, and the service merges it into its `RequestMetrics` (shipping the records
    themselves back would cost more than summing them). The tenant (the `tenant` tag) is kept so that
    the service can cap the label sets each tenant creates (`collector.label_budget`).
    """

    def __init__(self) -> None:
        self.by_labels: dict[tuple[str, ...], _LabelStats] = {}  # (instance, model, mode, drafter, tenant)
        self.arms: dict[tuple[str, ...], dict[str, float]] = {}  # by_labels' key + arm -> _ARM_DOCS totals

    @classmethod
    def of(cls, records: Iterable[RequestRecord]) -> RequestTotals:
        """Fields are read once per record, as tuples, and summed per label set by column."""
        totals = cls()
        groups: dict[tuple[str, ...], list[tuple]] = defaultdict(list)
        for row in map(_read_row, [r.__dict__ for r in records]):
            groups[(*row[:4], row[4].get("tenant"))].append(row)
        for (instance, model, mode, drafter, tenant), rows in groups.items():
            columns = dict(zip(_ROW_FIELDS, zip(*rows)))
            key = (instance, model, mode, drafter or "none", tenant)
            totals._add_group(totals.by_labels.setdefault(key, _LabelStats()), columns)
            if any(columns["arm"]):
                totals._add_arms(key, columns)
        return totals

    def _add_arms(self, key: tuple, columns: dict[str, tuple]) -> None:
        """The requests `spec_latency_regression` compares: ok, with output, under an arm."""
        for arm, status, output_tokens, e2e_s in zip(
            columns["arm"], columns["status"], columns["output_tokens"], columns["e2e_s"]
        ):
            if arm is not None and status == "ok" and output_tokens > 0:
                totals = self.arms.setdefault((*key, arm), dict.fromkeys(_ARM_DOCS, 0))
                totals["arm_requests"] += 1
                totals["arm_e2e_seconds_per_token"] += e2e_s / output_tokens

    @staticmethod
    def _add_group(stats: _LabelStats, columns: dict[str, tuple]) -> None:
        stats.status.update(columns["status"])
        for name, field in zip(_SUMS, _SUM_FIELDS):
            stats.sums[name] += sum(columns[field])
        drafted = np.array(columns["num_draft_tokens"], dtype=float)
        rates = np.array(columns["num_accepted_tokens"], dtype=float)[drafted > 0] / drafted[drafted > 0]
        stats.sums["acceptance_rate_requests"] += len(rates)
        stats.sums["acceptance_rate_sum"] += float(rates.sum())
        stats.sums["acceptance_rate_squares"] += float(np.square(rates).sum())
        stats.sums["oom_errors"] += sum(1 for error in columns["error"] if error and "oom" in error)
        stats.sums["first_position_accepted"] += sum(
            per_pos[0] for per_pos in columns["accepted_per_position"] if per_pos
        )
        RequestTotals._add_device_time(stats, columns)
        ttft = [v for v in columns["ttft_s"] if v is not None]
        for name, values in (("e2e", columns["e2e_s"]), ("ttft", ttft)):
            array = np.array(values, dtype=float)
            # bucket i holds bounds[i-1] < v <= bounds[i]; the last one is +Inf
            stats.buckets[name] += np.bincount(np.searchsorted(_BOUNDS, array, side="left"), minlength=len(_BOUNDS) + 1)
            stats.value_sums[name] += float(array.sum())

    @staticmethod
    def _add_device_time(stats: _LabelStats, columns: dict[str, tuple]) -> None:
        """The requests `spec_cost_excess` reads: ok, with output, carrying device_s."""
        for status, device_s, output_tokens in zip(columns["status"], columns["device_s"], columns["output_tokens"]):
            if status == "ok" and output_tokens > 0 and device_s is not None:
                stats.sums["device_timed_requests"] += 1
                stats.sums["device_seconds"] += device_s
                stats.sums["device_timed_output_tokens"] += output_tokens


class RequestMetrics:
    """Counters and latency histograms of stored requests, by instance/model/mode/drafter, in a
    bounded label space (`collector.label_budget`: past its caps a label set folds into `other`)."""

    def __init__(self, limits: LabelLimits = LabelLimits()) -> None:
        self.budget = LabelBudget(limits)
        self._by_labels: dict[Labels, _LabelStats] = {}
        self._arms: dict[tuple[str, str, str], dict[str, float]] = {}  # (instance, model, arm) -> _ARM_DOCS totals
        self._lock = threading.Lock()

    def observe(self, records: Iterable[RequestRecord]) -> None:
        self.add(RequestTotals.of(records))

    def add(self, totals: RequestTotals) -> None:
        with self._lock:
            for key, stats in totals.by_labels.items():
                labels = self.budget.labels(*key, requests=sum(stats.status.values()))
                self._by_labels.setdefault(labels, _LabelStats()).add(stats)
            for (*key, arm), sums in totals.arms.items():
                instance, model, _, _ = self.budget.labels(*key, requests=0)
                mine = self._arms.setdefault((instance, model, arm), dict.fromkeys(_ARM_DOCS, 0))
                for name, value in sums.items():
                    mine[name] += value

    def device_labels(self, instance: str, device: str) -> tuple[str, str]:
        with self._lock:
            return self.budget.device(instance, device)

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            items = [
                (
                    labels,
                    s.status.copy(),
                    s.sums.copy(),
                    {k: v.copy() for k, v in s.buckets.items()},
                    s.value_sums.copy(),
                )
                for labels, s in self._by_labels.items()
            ]
            arms = [(labels, totals.copy()) for labels, totals in self._arms.items()]
            folded = dict(self.budget.folded)
        requests = CounterMetricFamily("specwatch_requests", "Finished requests.", labels=[*REQUEST_LABELS, "status"])
        sums = {n: CounterMetricFamily(f"specwatch_{n}", doc, labels=REQUEST_LABELS) for n, doc in _SUM_DOCS.items()}
        hists = {
            n: HistogramMetricFamily(metric, doc, labels=REQUEST_LABELS) for n, (metric, doc) in _HISTOGRAMS.items()
        }
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
        yield self._folded_family(folded)

    @staticmethod
    def _folded_family(folded: dict[str, int]) -> Metric:
        family = CounterMetricFamily(
            "specwatch_metrics_folded_requests",
            "Requests counted under model/drafter (or instance) `other` on /metrics, by the label cap that folded "
            "them: tenant, instance or fleet (collector.label_budget).",
            labels=["cap"],
        )
        for cap in FOLD_CAPS:
            family.add_metric([cap], folded.get(cap, 0))
        return family

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
            "specwatch_ingest_records",
            "Records received by /v1/ingest, by kind and outcome.",
            ("kind", "outcome"),
            registry=registry,
        )
        self.ingest_rejected = Counter(
            "specwatch_ingest_rejected_batches",
            "Batches refused by /v1/ingest, by reason.",
            ("reason",),
            registry=registry,
        )
        self.ingest_conflicts = Counter(
            "specwatch_ingest_conflicts",
            "Resent requests (a request_id already stored) whose payload differs from the stored one; not stored.",
            registry=registry,
        )
        self.requests = RequestMetrics()
        registry.register(self.requests)
        self._device_metrics(registry)
        self._last_sample_at: dict[tuple[str, str], float] = {}

    def _device_metrics(self, registry: CollectorRegistry) -> None:
        labels = ("instance", "device")
        self.fragmentation = Gauge(
            "specwatch_device_fragmentation_ratio",
            "Last reported reserved/allocated memory ratio.",
            labels,
            registry=registry,
        )
        self.power = Gauge(
            "specwatch_device_power_watts", "Last reported device power draw.", labels, registry=registry
        )
        self.load = Gauge(
            "specwatch_device_load_ratio", "Last reported load of the instance.", labels, registry=registry
        )
        self.reserved = Gauge(
            "specwatch_device_memory_reserved_bytes", "Last reported reserved device memory.", labels, registry=registry
        )
        self.queue_depth = Gauge(
            "specwatch_device_queue_depth", "Last reported scheduler queue depth.", labels, registry=registry
        )
        self.util_draft = Gauge(
            "specwatch_device_util_draft_ratio",
            "Last reported busy fraction of the draft model.",
            labels,
            registry=registry,
        )

    def record_batch(self, counts: IngestCounts, new_requests: RequestTotals | None = None) -> None:
        """Account for a stored batch; only the records that were new move the request metrics
        (`new_requests`: their totals, when summed already, else taken from `counts.new_requests`)."""
        for kind, new, dup in (
            ("request", counts.requests, counts.request_duplicates),
            ("sample", counts.samples, counts.sample_duplicates),
            ("event", counts.events, counts.event_duplicates),
        ):
            self.ingest_records.labels(kind, "accepted").inc(new)
            self.ingest_records.labels(kind, "duplicate").inc(dup)
        self.ingest_conflicts.inc(counts.conflicts)
        self.requests.add(RequestTotals.of(counts.new_requests) if new_requests is None else new_requests)
        self._set_device_gauges(counts.new_samples)

    def record_rejected(self, reason: str) -> None:
        self.ingest_rejected.labels(reason).inc()

    def _set_device_gauges(self, samples: Iterable[DeviceSample]) -> None:
        for s in samples:
            labels = self.requests.device_labels(s.instance, s.device)
            if s.at < self._last_sample_at.get(labels, float("-inf")):
                continue  # a late (e.g. replayed) reading must not overwrite a newer one
            self._last_sample_at[labels] = s.at
            self.reserved.labels(*labels).set(s.mem_reserved_bytes)
            self.queue_depth.labels(*labels).set(s.queue_depth)
            for gauge, value in (
                (self.fragmentation, s.fragmentation),
                (self.power, s.power_w),
                (self.load, s.load),
                (self.util_draft, s.util_draft),
            ):
                if value is not None:
                    gauge.labels(*labels).set(value)


CAPACITY = "specwatch_upstream_capacity_tokens_per_second"
CAPACITY_DOC = (
    "Output tokens/s each upstream can serve at its current acceptance and load: time-weighted output tokens "
    "per attributed device-second of its recent requests (collector.reads.capacity; smoothed, no step when speculation "
    "switches)."
)


class CapacityGauge:
    """A prometheus_client collector of `specwatch_upstream_capacity_tokens_per_second{upstream}` from the store.

    Store-derived (the same on every replica): register it where only the leader exports it. The
    answer is kept `ttl_s` so scrapes in between reuse it; a failing query exports nothing."""

    def __init__(
        self,
        db,
        *,
        registry: CollectorRegistry,
        rules: CapacityRules = CapacityRules(),
        ttl_s: float = 10.0,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self._db, self._rules, self._ttl_s, self._clock = db, rules, ttl_s, clock
        self._lock = threading.Lock()
        self._measured_at: float | None = None
        self._values: list[Capacity] = []
        registry.register(self)

    def describe(self) -> Iterator[Metric]:
        yield GaugeMetricFamily(CAPACITY, CAPACITY_DOC, labels=["upstream"])

    def collect(self) -> Iterator[Metric]:
        """The upstreams with the most recent requests, at most LabelLimits.label_sets (instance names
        are producers' strings)."""
        family = GaugeMetricFamily(CAPACITY, CAPACITY_DOC, labels=["upstream"])
        busiest = sorted(self._current(), key=lambda c: -c.requests)[: LabelLimits.label_sets]
        for capacity in sorted(busiest, key=lambda c: c.instance):
            family.add_metric([capacity.instance], capacity.tokens_per_s)
        yield family

    def _current(self) -> list[Capacity]:
        with self._lock:
            now = self._clock()
            if self._measured_at is None or now - self._measured_at >= self._ttl_s:
                try:
                    self._values = upstream_capacity(self._db, now, self._rules)
                except SQLAlchemyError as exc:
                    logging.getLogger(__name__).warning("capacity gauge: %s", exc)
                    self._values = []
                self._measured_at = now
            return self._values
