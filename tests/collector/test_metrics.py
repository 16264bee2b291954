"""GET /metrics: valid exposition (promtool), counts that match what was stored, no double counting."""

from __future__ import annotations

import shutil
import subprocess

import pytest
from prometheus_client.parser import text_string_to_metric_families

from collector_payloads import request_dict, sample_dict


def scrape(client) -> dict[tuple[str, tuple], float]:
    response = client.get("/metrics")
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/plain")
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(response.text) for s in family.samples
    }


def total(samples, name: str, **labels) -> float:
    return sum(v for (n, ls), v in samples.items() if n == name and set(labels.items()) <= set(ls))


@pytest.fixture
def ingested(client) -> list[dict]:
    rows = [request_dict(i, instance=f"gpu-{i % 2}", status="error" if i % 5 == 0 else "ok") for i in range(50)]
    samples = [sample_dict(i, power_w=10.0 + i) for i in range(3)]
    assert client.post("/v1/ingest", json={"requests": rows, "samples": samples}).status_code == 200
    assert client.post("/v1/ingest", json={"requests": rows[:10]}).status_code == 200  # resent: duplicates
    assert client.post("/v1/ingest", content=b"{broken").status_code == 400
    return rows


def test_counters_match_stored_records_and_skip_duplicates(client, ingested):
    m = scrape(client)
    assert total(m, "specwatch_requests_total") == 50
    assert total(m, "specwatch_requests_total", status="error") == 10
    assert total(m, "specwatch_requests_total", instance="gpu-1") == 25
    assert total(m, "specwatch_draft_tokens_total") == sum(r["num_draft_tokens"] for r in ingested)
    assert total(m, "specwatch_accepted_tokens_total") == sum(r["num_accepted_tokens"] for r in ingested)
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


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian package `prometheus`)")
def test_exposition_passes_promtool(client, ingested):
    text = client.get("/metrics").text
    result = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
    assert result.returncode == 0 and result.stdout.strip() == "" and result.stderr.strip() == "", result
