"""Group-wise views over HTTP: breakdown, speculative-vs-plain comparison, throughput by load,
device series and sources, checked against numpy/scipy on the same records."""

from __future__ import annotations

import numpy as np
import pytest
from collector_payloads import T0, request_dict, sample_dict
from scipy.stats import mannwhitneyu

WINDOW = {"start": T0 - 1, "end": T0 + 1000}


def test_breakdown_by_drafter_and_tag(client):
    records = [
        request_dict(
            i,
            drafter=["ngram", None][i % 2],
            tags={"scenario": ["chat", "code"][i % 3 == 0]},
            **(
                {}
                if i % 2 == 0
                else {
                    "mode": "autoregressive",
                    "num_drafts": 0,
                    "num_draft_tokens": 0,
                    "num_accepted_tokens": 0,
                    "accepted_per_position": [],
                    "gamma": 0,
                }
            ),
        )
        for i in range(30)
    ]
    assert client.post("/v1/ingest", json={"requests": records}).status_code == 200
    groups = {g["key"]: g for g in client.get("/v1/breakdown", params={**WINDOW, "by": "drafter"}).json()["groups"]}
    assert set(groups) == {"ngram", "none"} and groups["ngram"]["requests"] == 15
    ngram = [r for r in records if r["drafter"] == "ngram"]
    assert groups["ngram"]["acceptance_rate"] == pytest.approx(sum(r["num_accepted_tokens"] for r in ngram) / (16 * 15))
    per_token = np.array([r["e2e_s"] / r["output_tokens"] for r in ngram])
    assert groups["ngram"]["s_per_token"]["p50"] == pytest.approx(np.median(per_token))
    assert groups["none"]["acceptance_rate"] is None
    by_tag = {
        g["key"]: g["requests"]
        for g in client.get("/v1/breakdown", params={**WINDOW, "by": "tag:scenario"}).json()["groups"]
    }
    assert by_tag == {"code": 10, "chat": 20}
    labels = client.get("/v1/labels", params=WINDOW).json()
    assert labels == {
        "instance": {"gpu-0": 30},
        "model": {"smollm2-135m": 30},
        "drafter": {"ngram": 15},
        "mode": {"speculative": 15, "autoregressive": 15},
        "arm": {},
        "tag:scenario": {"chat": 20, "code": 10},
    }
    bad = client.get("/v1/breakdown", params={**WINDOW, "by": "colour"})
    assert bad.status_code == 422 and "cannot group by 'colour'" in bad.json()["detail"]["message"]


def test_compare_arms_with_significance(client):
    rng = np.random.default_rng(0)
    e2e = {arm: rng.normal(mean, 0.1, 40) for arm, mean in (("spec", 1.0), ("control", 1.6))}
    records = [
        request_dict(i + 100 * k, arm=arm, e2e_s=float(e2e[arm][i]), output_tokens=64)
        for k, arm in enumerate(e2e)
        for i in range(40)
    ]
    assert client.post("/v1/ingest", json={"requests": records}).status_code == 200
    got = client.get("/v1/compare", params={**WINDOW, "by": "arm"}).json()
    assert got["speedup"] == pytest.approx(e2e["control"].mean() / e2e["spec"].mean())
    assert got["p_value"] == pytest.approx(mannwhitneyu(e2e["spec"] / 64, e2e["control"] / 64).pvalue)
    assert got["speculative"]["requests"] == got["plain"]["requests"] == 40


def test_throughput_by_load_devices_and_sources(client):
    records = [
        request_dict(i, load_at_admission=[0.1, 0.9][i % 2], output_tokens=60, e2e_s=[1.0, 3.0][i % 2], queue_s=0.0)
        for i in range(20)
    ]
    samples = [sample_dict(i) for i in range(50)]
    assert client.post("/v1/ingest", json={"requests": records, "samples": samples}).status_code == 200
    buckets = {
        (b["low"], b["requests"]): b["tokens_per_s"] for b in client.get("/v1/throughput/by-load", params=WINDOW).json()
    }
    assert buckets == {(0.0, 10): pytest.approx(60.0), (0.75, 10): pytest.approx(20.0)}
    points = client.get("/v1/devices/series", params={**WINDOW, "max_points": 10}).json()
    assert len(points) == 10 and points[0]["at"] == T0 and points[-1]["at"] == T0 + 5 * 49
    (db,) = client.get("/v1/sources", params=WINDOW).json()
    assert (db["kind"], db["name"], db["records_in_window"], db["last_seen_at"]) == (
        "engine",
        "gpu-0",
        20,
        T0 + 5 * 49,
    )


@pytest.mark.parametrize(
    "path, params, message",
    [
        ("/v1/report", {"month": "2026-13"}, "month must be YYYY-MM"),
        ("/v1/report", {"month": "2999-01"}, "has not begun yet"),
        ("/v1/report", {"month": "2026-05", "gpu": "abacus"}, "abacus"),
        ("/v1/compare", {"by": "tenant"}, None),
        ("/v1/devices/series", {"max_points": 1}, None),
    ],
)
def test_dashboard_endpoints_reject_bad_input_with_a_message(client, path, params, message):
    response = client.get(path, params=params)
    assert response.status_code == 422, response.text
    if message:
        assert message in response.json()["detail"]["message"]
