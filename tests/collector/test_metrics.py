"""GET /metrics: valid exposition (promtool), counts that match what was stored, no double counting."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
from collector_payloads import plain_request_dict, request_dict, sample_dict
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from specwatch.collector.ingest.store import IngestCounts
from specwatch.collector.metrics import CollectorMetrics
from specwatch.telemetry.schema import DeviceSample, RequestRecord


def scrape(client) -> dict[tuple[str, tuple], float]:
    response = client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
    }


def total(samples, name: str, **labels) -> float:
    return sum(v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls))


@pytest.fixture
def ingested(client) -> list[dict]:
    rows = [request_dict(i, instance=f"gpu-{i % 2}", status="error" if i % 5 == 0 else "ok") for i in range(50)]
    samples = [sample_dict(i, power_w=10.0 + i) for i in range(3)]
    assert client.post("/v1/ingest", json={"requests": rows, "samples": samples}).status_code == 200
    assert client.post("/v1/ingest", json={"requests": rows[:10]}).status_code == 200  # resent: duplicates
    assert (
        client.post("/v1/ingest", content=b"{broken", headers={"content-type": "application/json"}).status_code == 400
    )
    return rows


def test_counters_match_stored_records_and_skip_duplicates(client, ingested):
    m = scrape(client)
    assert total(m, "specwatch_requests_total") == 50
    assert total(m, "specwatch_requests_total", status="error") == 10
    assert total(m, "specwatch_requests_total", instance="gpu-1") == 25
    assert total(m, "specwatch_draft_tokens_total") == sum(r["num_draft_tokens"] for r in ingested)
    assert total(m, "specwatch_accepted_tokens_total") == sum(r["num_accepted_tokens"] for r in ingested)
    first = sum(r["accepted_per_position"][0] for r in ingested)  # conditional acceptance's numerator
    assert total(m, "specwatch_first_position_accepted_total") == first
    assert total(m, "specwatch_e2e_request_latency_seconds_count") == 50
    assert total(m, "specwatch_time_to_first_token_seconds_sum") == pytest.approx(sum(r["ttft_s"] for r in ingested))
    assert total(m, "specwatch_ingest_records_total", kind="request", outcome="accepted") == 50
    assert total(m, "specwatch_ingest_records_total", kind="request", outcome="duplicate") == 10
    assert total(m, "specwatch_ingest_rejected_batches_total", reason="invalid_json") == 1


def test_device_gauges_keep_the_newest_reading(client, ingested):
    late = sample_dict(0, at=sample_dict(0)["at"] - 60, power_w=999.0)  # an old reading replayed late
    assert client.post("/v1/ingest", json={"samples": [late]}).status_code == 200
    m = scrape(client)
    assert total(m, "specwatch_device_power_watts", instance="gpu-0", device="cpu") == 12.0


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not found: apt-get install prometheus")
def test_exposition_passes_promtool(client, ingested):
    text = client.get("/metrics").text
    result = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0 and result.stdout.strip() == "" and result.stderr.strip() == "", result


def observed(requests: list[dict], samples: list[dict]) -> dict[tuple[str, tuple], float]:
    """Feed stored records straight to CollectorMetrics and parse its exposition."""
    metrics = CollectorMetrics(CollectorRegistry())
    metrics.record_batch(
        IngestCounts(
            requests=len(requests),
            samples=len(samples),
            new_requests=tuple(RequestRecord.model_validate(r) for r in requests),
            new_samples=tuple(DeviceSample.model_validate(s) for s in samples),
        )
    )
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(generate_latest(metrics.registry).decode())
        for s in family.samples
    }


def test_alert_counters_match_the_records():
    """The counters the exported Prometheus alert rules read, recomputed from the records fed."""
    rows = [
        request_dict(
            i,
            num_accepted_tokens=i % 9,
            accepted_per_position=[],
            gamma=0,
            arm=("spec", "control")[i % 2],
            status="error" if i % 6 == 0 else "ok",
            error="target:oom" if i % 6 == 0 else None,
            output_tokens=i % 4 * 10,
        )
        for i in range(30)
    ]
    rows += [
        plain_request_dict(
            100 + i,
            error="draft:oom",
        )
        for i in range(4)
    ]
    m = observed(rows, [sample_dict(i, util_draft=u) for i, u in enumerate([0.1, 0.7, 0.4])])
    rates = np.array([r["num_accepted_tokens"] / r["num_draft_tokens"] for r in rows if r["num_draft_tokens"]])
    assert total(m, "specwatch_acceptance_rate_requests_total") == len(rates) == 30
    assert total(m, "specwatch_acceptance_rate_requests_total", mode="autoregressive") == 0
    assert total(m, "specwatch_acceptance_rate_sum_total") == pytest.approx(rates.sum())
    assert total(m, "specwatch_acceptance_rate_squares_total") == pytest.approx(np.square(rates).sum())
    assert total(m, "specwatch_oom_errors_total") == 5 + 4
    assert total(m, "specwatch_oom_errors_total", mode="autoregressive", drafter="none") == 4
    assert total(m, "specwatch_device_util_draft_ratio", instance="gpu-0", device="cpu") == 0.4
    for arm in ("spec", "control"):
        counted = [r for r in rows if r.get("arm") == arm and r["status"] == "ok" and r["output_tokens"] > 0]
        assert total(m, "specwatch_arm_requests_total", arm=arm, instance="gpu-0", model="smollm2-135m") == len(counted)
        assert total(m, "specwatch_arm_e2e_seconds_per_token_total", arm=arm) == pytest.approx(
            sum(r["e2e_s"] / r["output_tokens"] for r in counted)
        )


def test_device_time_counters_count_ok_requests_with_output_and_device_s():
    """What the exported SpeculationCostsMore rule reads: only ok requests with output that carry device_s."""
    timed = {"device_s_source": "engine"}
    rows = [request_dict(i, device_s=0.5 + i / 10, output_tokens=40 + i, **timed) for i in range(6)]
    rows += [plain_request_dict(10 + i, device_s=0.4, output_tokens=50, **timed) for i in range(3)]
    rows += [
        request_dict(20, device_s=9.0, status="error", error="timeout", **timed),  # failed
        request_dict(21, device_s=9.0, output_tokens=0, **timed),  # no output
        request_dict(22),  # no device_s
    ]
    m = observed(rows, [])
    spec = dict(mode="speculative", drafter="ngram")
    assert total(m, "specwatch_device_timed_requests_total", **spec) == 6
    assert total(m, "specwatch_device_seconds_total", **spec) == pytest.approx(sum(0.5 + i / 10 for i in range(6)))
    assert total(m, "specwatch_device_timed_output_tokens_total", **spec) == sum(40 + i for i in range(6))
    plain = dict(mode="autoregressive", drafter="none")
    assert total(m, "specwatch_device_timed_requests_total", **plain) == 3
    assert total(m, "specwatch_device_seconds_total", **plain) == pytest.approx(1.2)
    assert total(m, "specwatch_device_timed_output_tokens_total", **plain) == 150
