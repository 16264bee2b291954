"""The speculation-aware capacity gauge: per upstream, from stored records, no step when speculation switches."""

from __future__ import annotations

import math
import time

import pytest
from collector_payloads import T0, request_dict
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from waiting import wait_for

from specwatch.collector.ingest.store import Store
from specwatch.collector.metrics import CAPACITY, CapacityGauge
from specwatch.collector.reads.capacity import CapacityRules, Served, estimate, upstream_capacity
from specwatch.telemetry.schema import IngestBatch

RULES = CapacityRules()
SPEC_TPS, PLAIN_TPS = 300.0, 120.0  # tokens per device-second with speculation on, then off


def served_stream(switch_at: float, end: float, every_s: float = 1.0) -> list[Served]:
    """A request per second for 3 tau up to `end`, 64 tokens each, at SPEC_TPS before `switch_at`, PLAIN_TPS after."""
    out, t = [], min(switch_at, end) - 3 * RULES.tau_s
    while t <= end:
        out.append(Served(t, 64, 64 / (SPEC_TPS if t < switch_at else PLAIN_TPS)))
        t += every_s
    return out


def test_a_steady_upstream_reads_its_tokens_per_device_second():
    assert estimate(served_stream(T0 + 10_000, T0), T0) == pytest.approx(SPEC_TPS)


def test_switching_speculation_off_ramps_the_gauge_instead_of_stepping_it():
    served = served_stream(T0, T0 + 3 * RULES.tau_s)
    scrapes = [estimate(served, T0 + 15 * i) for i in range(int(3 * RULES.tau_s / 15) + 1)]
    steps = [a - b for a, b in zip(scrapes, scrapes[1:])]
    assert scrapes[0] == pytest.approx(SPEC_TPS, rel=1e-2)
    assert all(step >= 0 for step in steps)  # monotone toward the new capacity
    # a scrape moves it by at most (1 - exp(-dt / tau)) * old / new of the gap: ~10% here, never a step
    bound = (1 - math.exp(-15 / RULES.tau_s)) * SPEC_TPS / PLAIN_TPS * (SPEC_TPS - PLAIN_TPS)
    assert max(steps) <= bound <= 0.11 * (SPEC_TPS - PLAIN_TPS)
    assert scrapes[-1] < PLAIN_TPS + 0.2 * (SPEC_TPS - PLAIN_TPS)  # and it gets there


def test_too_few_recent_requests_give_no_estimate():
    few = [Served(T0 - i, 64, 0.2) for i in range(RULES.min_requests - 1)]
    assert estimate(few, T0) is None
    stale = [Served(T0 - 4 * RULES.tau_s - i, 64, 0.2) for i in range(20)]
    assert estimate(stale, T0) is None


def records(now: float) -> list[dict]:
    def timed(i: int, instance: str, device_s: float, **extra) -> dict:
        row = request_dict(i, instance=instance, started_at=now - 100 + i % 50, e2e_s=1.0, output_tokens=64)
        return {**row, "device_s": device_s, "device_s_source": "processor_sharing", **extra}

    rows = [timed(i, "vllm-a", 0.25) for i in range(10)]  # 256 tokens/device-s
    rows += [timed(100 + i, "vllm-b", 0.5) for i in range(10)]  # 128
    rows += [timed(200 + i, "vllm-b", 0.01, status="error", error="timeout") for i in range(5)]  # not served
    rows += [request_dict(300 + i, instance="vllm-c", started_at=now - 50 + i) for i in range(10)]  # no device_s
    return rows


def test_the_gauge_reads_each_upstream_from_the_store_on_a_fresh_registry(db):
    now = T0 + 1000
    Store(db).insert(IngestBatch.model_validate({"requests": records(now)}))
    assert {c.instance: c.requests for c in upstream_capacity(db, now)} == {"vllm-a": 10, "vllm-b": 10}
    registry = CollectorRegistry()
    CapacityGauge(db, registry=registry, clock=lambda: now)
    assert registry.get_sample_value(CAPACITY, {"upstream": "vllm-a"}) == pytest.approx(256.0)
    assert registry.get_sample_value(CAPACITY, {"upstream": "vllm-b"}) == pytest.approx(128.0)
    assert registry.get_sample_value(CAPACITY, {"upstream": "vllm-c"}) is None


def test_the_leader_exports_the_gauge_on_metrics(client):
    now = time.time()
    assert client.post("/v1/ingest", json={"requests": records(now)}).status_code == 200

    def exported() -> dict:  # leader-only: on PostgreSQL the replica takes the lead a moment after start
        return {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}

    families = wait_for(lambda: (f := exported()).get(CAPACITY) and f[CAPACITY].samples and f, "the gauge", timeout=30)
    values = {s.labels["upstream"]: s.value for s in families[CAPACITY].samples}
    assert values == pytest.approx({"vllm-a": 256.0, "vllm-b": 128.0}, rel=1e-6)
