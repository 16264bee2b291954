"""The decision advisor: its rule table on hand-made evidence, and evidence measured from a store."""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import numpy as np
import pytest
from collector_payloads import T0, plain_request_dict, request_dict, sample_dict

from specwatch.collector.ingest.store import Store
from specwatch.collector.reads.queries import Window
from specwatch.cost.advisor import GIB, ScenarioEvidence, advise, recommend, scenario_evidence
from specwatch.telemetry.schema import IngestBatch

BASE = ScenarioEvidence(
    scenario="summary",
    requests=200,
    speculative_requests=100,
    drafters=("model:draft",),
    context_tokens_p50=300,
    context_tokens_p90=450,
    context_tokens_max=800,
    ttft_p50_s=0.05,
    ttft_p99_s=0.2,
    acceptance_rate=0.7,
    speedup=1.6,
    p_value=0.001,
    compared_by="arm",
    peak_memory_bytes=40 * GIB,
    device_memory_bytes=80 * GIB,
    gpu_count=1,
    load_mean=0.5,
    greedy_share=None,
    determinism_required=False,
    latency_sensitive=False,
)
HURTS, UNCLEAR, NONE = (
    {"speedup": 0.8, "p_value": 0.001},
    {"speedup": 1.02, "p_value": 0.4},
    {"speedup": None, "p_value": None},
)


@pytest.mark.parametrize(
    "changes, action, rule",
    [
        ({}, "enable", "short_batch"),
        (
            {"scenario": "chat", "latency_sensitive": True, "context_tokens_p90": 2000},
            "enable",
            "latency_sensitive_chat",
        ),
        ({"latency_sensitive": True, **HURTS}, "disable", "latency_sensitive_chat_contradicted"),
        ({**NONE}, "enable", "short_batch"),  # guidance, not contradicted: no control measured yet
        ({"speedup": 0.97, "p_value": 0.3}, "canary", "unclear"),  # guidance, but the point estimate is below 1
        ({"context_tokens_p90": 4000}, "enable", "measured_speedup"),
        ({"context_tokens_p90": 4000, **HURTS}, "disable", "measured_slowdown"),
        ({"context_tokens_p90": 4000, **UNCLEAR}, "canary", "unclear"),
        ({"context_tokens_p50": 200_000, "context_tokens_p90": 300_000, **UNCLEAR}, "disable", "long_context"),
        ({"context_tokens_p50": 200_000, "context_tokens_p90": 300_000}, "canary", "long_context_contradicted"),
        ({"device_memory_bytes": 16 * GIB, "peak_memory_bytes": 4 * GIB, **UNCLEAR}, "disable", "edge_device"),
        ({"peak_memory_bytes": 90 * GIB, **HURTS}, "disable", "memory_beyond_one_device"),
        ({"gpu_count": 2, "peak_memory_bytes": 100 * GIB, **NONE}, "disable", "memory_beyond_one_device"),
        ({"peak_memory_bytes": 75 * GIB, "context_tokens_p90": 4000, **UNCLEAR}, "canary", "unclear"),  # tight memory
        ({"requests": 10}, "canary", "insufficient_data"),
        ({"speculative_requests": 0}, "canary", "insufficient_data"),
    ],
)
def test_rule_table(changes, action, rule):
    got = recommend(replace(BASE, **changes))
    assert (got.action, got.rule) == (action, rule)


def test_reasons_carry_the_numbers():
    got = recommend(
        replace(BASE, scenario="chat", latency_sensitive=True, speedup=0.8, p_value=0.001, acceptance_rate=0.31)
    )
    assert "0.80x" in got.reason and "p=0.001" in got.reason and "acceptance 0.31" in got.reason
    (contradiction,) = got.contradictions
    assert contradiction.startswith("guidance says enable (latency-sensitive") and "0.80x" in contradiction
    edge = recommend(replace(BASE, device_memory_bytes=16 * GIB, peak_memory_bytes=2 * GIB, drafters=("ngram",)))
    assert edge.action == "canary" and "16.0 GiB" in edge.reason
    assert "n-gram drafting holds no draft weights" in edge.contradictions[0]


def test_determinism_on_greedy_requests_is_no_reason_to_disable():
    got = recommend(replace(BASE, determinism_required=True, greedy_share=1.0))
    assert got.action == "enable"
    assert (
        "token-identical" not in got.reason and "exactly the tokens of plain greedy decoding" in got.contradictions[0]
    )
    assert "no reason to disable" in got.contradictions[0]
    sampled = recommend(replace(BASE, determinism_required=True, greedy_share=0.5))
    assert "not per-seed outputs" in sampled.contradictions[0]


def test_evidence_and_advice_from_a_store(db):
    rng = np.random.default_rng(1)
    tags_chat = {"scenario": "chat", "determinism": "required", "temperature": "0"}
    chat = [
        request_dict(
            i, e2e_s=float(rng.normal(1.0, 0.05)), prompt_tokens=200, output_tokens=64, tags=tags_chat, instance="gpu-1"
        )
        for i in range(40)
    ]
    chat += [
        plain_request_dict(
            100 + i,
            e2e_s=float(rng.normal(1.6, 0.05)),
            prompt_tokens=200,
            output_tokens=64,
            tags=tags_chat,
            instance="gpu-1",
        )
        for i in range(40)
    ]
    # long documents: speculative requests take 3 s, plain ones 2 s
    long_doc = {"scenario": "long-doc"}
    docs = [
        payload(first + i, prompt_tokens=200_000, output_tokens=100, e2e_s=float(rng.normal(e2e_s, 0.1)), tags=long_doc)
        for first, payload, e2e_s in ((200, request_dict, 3.0), (300, plain_request_dict, 2.0))
        for i in range(20)
    ]
    few = [request_dict(400 + i, tags={}) for i in range(3)]
    samples = [sample_dict(i, instance="gpu-1", mem_reserved_bytes=(20 + i) * GIB) for i in range(5)]
    Store(db).insert(IngestBatch.model_validate({"requests": chat + docs + few, "samples": samples}))
    window = Window(T0 - 1, T0 + 1000)
    evidence = {ev.scenario: ev for ev in scenario_evidence(db, window, device_memory_bytes=80 * GIB)}
    assert set(evidence) == {"chat", "long-doc", "untagged"}
    ev = evidence["chat"]
    assert (ev.requests, ev.speculative_requests, ev.drafters, ev.compared_by) == (80, 40, ("ngram",), "mode")
    per_token = [
        np.array([r["e2e_s"] / 64 for r in chat if r["mode"] == mode]) for mode in ("speculative", "autoregressive")
    ]
    assert ev.speedup == pytest.approx(per_token[1].mean() / per_token[0].mean())
    assert (
        ev.context_tokens_p50 == 264 and ev.peak_memory_bytes == 24 * GIB and ev.memory_headroom == pytest.approx(0.7)
    )
    assert ev.greedy_share == 1.0 and ev.determinism_required and ev.latency_sensitive
    assert ev.ttft_p99_s == pytest.approx(np.quantile([r["ttft_s"] for r in chat], 0.99))
    assert evidence["long-doc"].peak_memory_bytes is None  # gpu-0 sent no samples
    advice = {r.scenario: r for r in advise(db, window, device_memory_bytes=80 * GIB)}
    assert (advice["chat"].action, advice["chat"].rule) == ("enable", "latency_sensitive_chat")
    assert "no reason to disable" in advice["chat"].contradictions[0]
    assert (advice["long-doc"].action, advice["long-doc"].rule) == ("disable", "long_context")
    assert (advice["untagged"].action, advice["untagged"].rule) == ("canary", "insufficient_data")


def test_the_advice_reads_as_a_sentence():
    """Issue 55: no 'canary — edge_device_contradicted' for a measured 3.98x: the rule in words, then why."""
    from specwatch.cost.advisor import Recommendation, advice_sentence

    why = "device memory 0.5 GiB <= 8 GiB; speed-up 3.98x"
    said = advice_sentence("chat", "canary", "edge_device_contradicted", why)
    assert said == (
        "Run speculation as a canary (an A/B share) for chat: the guidance (the device is an edge device with "
        "little memory) says otherwise, but the measurement disagrees (device memory 0.5 GiB <= 8 GiB; "
        "speed-up 3.98x)."
    )
    assert advice_sentence("code", "enable", "measured_speedup", "speed-up 2.10x") == (
        "Enable speculation for code: speculation measured faster (speed-up 2.10x)."
    )
    assert "sentence" in {f.name for f in dataclasses.fields(Recommendation)}  # it reaches the API's JSON
