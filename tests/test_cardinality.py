"""No Prometheus label can grow without bound: after records with thousands of distinct tags and request
ids, every metric family the engine, the gateway and the collector register has the same series as after
one record per label set, and no label value is a tag value or a request id."""

from __future__ import annotations

from types import SimpleNamespace

from collector_payloads import request_dict
from prometheus_client import CollectorRegistry

from specwatch.collector.ingest.store import IngestCounts
from specwatch.collector.metrics import CollectorMetrics
from specwatch.engine.metrics import EngineMetrics
from specwatch.gateway.metrics import GatewayMetrics
from specwatch.gateway.upstreams import Upstream, UpstreamState
from specwatch.telemetry.schema import RequestRecord
from specwatch.telemetry.sink import TelemetrySink

INSTANCES = ("vllm-a", "vllm-b")


def records(n: int) -> list[RequestRecord]:
    def one(i: int) -> RequestRecord:
        tags = {"tenant": f"tenant-{i}", "user": f"user-{i}", "session": f"sess-{i}"}
        fields = request_dict(i, instance=INSTANCES[i % 2], tags=tags, request_id=f"rid-{i:06d}")
        return RequestRecord.model_validate(fields)

    return [one(i) for i in range(n)]


def registries(batch: list[RequestRecord]) -> dict[str, CollectorRegistry]:
    state = {"override": "auto", "load_allows_speculation": True}
    scheduler = SimpleNamespace(
        active=0, queue_depth=0, load=0.0, policy=SimpleNamespace(state=state), sink=TelemetrySink("t")
    )
    db, gateway, collector = CollectorRegistry(), CollectorRegistry(), CollectorRegistry()
    engine_metrics = EngineMetrics(scheduler, registry=db)
    states = {
        name: UpstreamState(Upstream(name, f"http://{name}:8000", drafter="ngram", pool="spec")) for name in INSTANCES
    }
    gateway_metrics = GatewayMetrics(states, gateway)
    for record in batch:
        engine_metrics.observe(record)
        gateway_metrics.observe(record)
    CollectorMetrics(collector).record_batch(IngestCounts(requests=len(batch), new_requests=tuple(batch)))
    return {"engine": db, "gateway": gateway, "collector": collector}


def series(registry: CollectorRegistry) -> set[tuple[str, tuple]]:
    return {(s.name, tuple(sorted(s.labels.items()))) for f in registry.collect() for s in f.samples}


def test_no_label_grows_with_tags_or_request_ids():
    few, many = registries(records(4)), registries(records(2000))
    for producer in ("engine", "gateway", "collector"):
        assert series(many[producer]) == series(few[producer]), producer
        values = {v for _, labels in series(many[producer]) for _, v in labels}
        assert not {v for v in values if v.startswith(("tenant-", "user-", "sess-", "rid-"))}, producer
        assert len(series(many[producer])) < 500, producer
