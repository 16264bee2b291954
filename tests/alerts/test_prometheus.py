"""Prometheus rule export: promtool accepts the file and passes the generated unit tests, and
every metric and label the `specwatch` group reads is one the collector really exposes."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from specwatch.alerts.detector_gauges import DetectorGauges
from specwatch.alerts.detector_store import SeriesRow, save_rows
from specwatch.alerts.prometheus import GROUP, VLLM_GROUP, export, rule_groups, unit_tests
from specwatch.alerts.rules import DEFAULT_RULES, RulesError, load_config, parse_config
from specwatch.collector.db import make_db, upgrade, write_transaction
from specwatch.collector.ingest.store import IngestCounts, Store
from specwatch.collector.metrics import CollectorMetrics
from specwatch.collector.speculation_gauges import SpeculationGauges
from specwatch.telemetry.schema import DeviceSample, IngestBatch, RequestRecord

VLLM_FIXTURE = Path(__file__).parents[1] / "collector" / "fixtures" / "vllm_metrics.txt"
USER_RULES = {
    "evaluation": {"interval": "10s"},
    "rules": [
        {
            "name": "AcceptanceLowAnywhere",
            "signal": "acceptance_rate",
            "op": "<=",
            "threshold": 0.45,
            "window": "90s",
            "for": "30s",
            "keep_firing_for": "2m",
            "min_samples": 5,
            "group_by": [],
            "summary": "acceptance {{ $value }} of {{ $labels.model }}",
        },
        {  # the acceptance rule on another definition: position 0 (docs/glossary.md), with its vLLM equivalent
            "name": "FirstTokenAcceptanceLow",
            "signal": "conditional_acceptance",
            "op": "<",
            "threshold": 0.6,
            "window": "5m",
            "for": "1m",
            "min_samples": 20,
            "group_by": ["instance", "model"],
        },
        {
            "name": "TTFTByMode",
            "signal": "ttft_p99",
            "op": ">=",
            "threshold": 1.5,
            "window": "2m",
            "min_samples": 1,
            "group_by": ["model", "mode"],
            "severity": "info",
            "summary": "{{$value}} s in {{ $labels.mode }} mode",
        },
        {
            "name": "AcceptanceSpread",
            "signal": "acceptance_stddev",
            "op": ">",
            "threshold": 0.3,
            "window": "10m",
            "for": "2m",
            "min_samples": 50,
            "group_by": ["drafter"],
        },
        {
            "name": "SpecSlower",
            "signal": "spec_latency_regression",
            "op": ">=",
            "threshold": 0,
            "window": "30m",
            "min_samples": 3,
            "group_by": ["model"],
        },
        {
            "name": "SpecCostlierAnywhere",
            "signal": "spec_cost_excess",
            "op": ">=",
            "threshold": 0.2,
            "window": "2h",
            "for": "10m",
            "min_samples": 10,
            "group_by": [],
            "summary": "{{ $value }} dearer on {{ $labels.model }}",
        },
        {"name": "AnyOOM", "signal": "oom_count", "op": ">", "threshold": 0, "window": "1h", "min_samples": 1},
        {
            "name": "FragmentedFleet",
            "signal": "fragmentation",
            "op": ">",
            "threshold": 2,
            "window": "3m",
            "min_samples": 8,
            "group_by": ["instance"],
            "description": "{{ $labels.device }} is not grouped on",
        },
        {
            "name": "UtilSteady",
            "signal": "draft_util_swing",
            "op": "<",
            "threshold": 5,
            "window": "1m",
            "min_samples": 0,
            "group_by": ["device"],
        },
        {"name": "VllmTTFTAll", "signal": "vllm_ttft_p99", "op": ">", "threshold": 2, "window": "5m", "min_samples": 0},
    ],
}
CONFIGS = {"default": lambda: load_config(DEFAULT_RULES), "user": lambda: parse_config(USER_RULES, "user")}
promtool = pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not found: apt-get install prometheus")


def exported(config) -> list[dict]:
    return [rule for group in rule_groups(config)["groups"] for rule in group["rules"]]


@promtool
@pytest.mark.parametrize("name", CONFIGS)
def test_promtool_accepts_the_rules_and_passes_the_unit_tests(name, tmp_path):
    rules, tests = export(CONFIGS[name](), tmp_path)
    for command in (["check", "rules", str(rules)], ["test", "rules", str(tests)]):
        result = subprocess.run(
            ["promtool", *command], check=False, capture_output=True, text=True, timeout=120, cwd=tmp_path
        )
        assert result.returncode == 0, result.stdout + result.stderr
    assert yaml.safe_load(rules.read_text()) == rule_groups(CONFIGS[name]())


@pytest.mark.parametrize("name", CONFIGS)
def test_every_rule_has_a_firing_and_a_quiet_case(name):
    config = CONFIGS[name]()
    cases: dict[str, list[bool]] = {}
    for test in unit_tests(config)["tests"]:
        for check in test["alert_rule_test"]:
            cases.setdefault(check["alertname"], []).append(bool(check["exp_alerts"]))
    assert set(cases) == {rule["alert"] for rule in exported(config)}
    assert all(True in fired and False in fired for fired in cases.values()), cases


def test_vllm_group_has_equivalents_but_no_duplicates():
    default = {g["name"]: [r["alert"] for r in g["rules"]] for g in rule_groups(load_config(DEFAULT_RULES))["groups"]}
    # SpecAcceptanceLow / TTFTP99High over vLLM would be VllmAcceptanceLow / VllmTTFTP99High verbatim
    assert default[VLLM_GROUP] == ["VllmAcceptanceLow", "VllmTTFTP99High"]
    user = {r["alert"]: r for r in rule_groups(parse_config(USER_RULES))["groups"][1]["rules"]}
    assert list(user) == ["VllmTTFTAll", "VllmAcceptanceLowAnywhere", "VllmFirstTokenAcceptanceLow", "VllmTTFTByMode"]
    first = user["VllmFirstTokenAcceptanceLow"]["expr"]  # conditional acceptance over vLLM's own counters
    assert 'vllm:spec_decode_num_accepted_tokens_per_pos_total{position="0"}' in first
    assert "{{ $labels.model_name }}" in user["VllmAcceptanceLowAnywhere"]["annotations"]["summary"]
    assert "by (le, model_name)" in user["VllmTTFTByMode"]["expr"]  # mode: vLLM serves one
    assert user["VllmAcceptanceLowAnywhere"]["keep_firing_for"] == "2m"


def test_regression_rule_says_it_has_no_significance_test():
    rule = next(r for r in exported(load_config(DEFAULT_RULES)) if r["alert"] == "LatencyRegressionUnderSpeculation")
    assert "Mann-Whitney" in rule["annotations"]["note"]


def test_cost_rule_compares_device_seconds_per_token_of_the_two_modes():
    rule = next(r for r in exported(load_config(DEFAULT_RULES)) if r["alert"] == "SpeculationCostsMore")
    assert metric_names(rule["expr"]) == {
        "specwatch_device_seconds_total",
        "specwatch_device_timed_output_tokens_total",
        "specwatch_device_timed_requests_total",
    }
    assert rule["expr"].count('mode="speculative"') == 2 and rule["expr"].count('mode="autoregressive"') == 2
    assert "[1h]" in rule["expr"] and rule["expr"].endswith(">= 50") and "> 0.05" in rule["expr"]


def collector_exposition() -> dict[str, set[str]]:
    """Sample name -> label names, as the collector's /metrics shows them after some traffic."""
    metrics = CollectorMetrics(CollectorRegistry())
    requests = [
        RequestRecord(
            request_id=f"r{i}",
            instance="gpu-0",
            model="m",
            drafter="ngram",
            mode="speculative",
            arm=("spec", "control")[i % 2],
            started_at=1.7e9 + i,
            ttft_s=0.1,
            e2e_s=1.0,
            prompt_tokens=10,
            output_tokens=20,
            num_drafts=4,
            num_draft_tokens=8,
            num_accepted_tokens=i % 8,
            error="draft:oom" if i == 3 else None,
        )
        for i in range(4)
    ]
    sample = DeviceSample(
        instance="gpu-0",
        at=1.7e9,
        device="cpu",
        mem_allocated_bytes=10,
        mem_reserved_bytes=12,
        fragmentation=1.2,
        util_draft=0.3,
    )
    metrics.record_batch(IngestCounts(requests=4, samples=1, new_requests=tuple(requests), new_samples=(sample,)))
    db = make_db("sqlite://")  # the leader's detector gauges over a store holding one row of each kind
    upgrade(db)
    series = (("drafter", "ngram"), ("instance", "gpu-0"), ("model", "m"), ("tag", "none"))
    drift = SeriesRow("drift", series, 1.2, 1, True)
    drop = SeriesRow("regression", (("instance", "gpu-0"), ("marker", "2026-12-01"), ("model", "m")), 0.2, 1, True)
    with write_transaction(db) as conn:
        save_rows(conn, [drift, drop])
    DetectorGauges(db, registry=metrics.registry)
    Store(db).insert(IngestBatch(requests=requests))  # speculative records: the speculation gauges' instance
    SpeculationGauges(db, registry=metrics.registry, window_s=120, min_fraction=0.05, clock=lambda: 1.7e9 + 60)
    return exposed_labels(generate_latest(metrics.registry).decode())


def exposed_labels(text: str) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            found.setdefault(s.name, set()).update(s.labels)
    return found


def metric_names(expr: str) -> set[str]:
    """Metric names in a PromQL expression: identifiers followed by a selector or range."""
    return set(re.findall(r"([a-zA-Z_:][\w:]*)\s*[{\[]", expr))


def grouping_labels(expr: str) -> set[str]:
    return {label.strip() for group in re.findall(r"\b(?:by|on)\s*\(([^)]*)\)", expr) for label in group.split(",")} - {
        ""
    }


@pytest.mark.parametrize("name", CONFIGS)
def test_rules_read_only_what_the_collector_and_vllm_expose(name):
    """Names and labels in the exprs, and in the unit tests' input series, exist in the real exposition."""
    config = CONFIGS[name]()
    scrape_labels = {"instance", "job"}  # added by Prometheus to everything scraped from vLLM
    sources = {
        GROUP: collector_exposition(),
        VLLM_GROUP: {n: labels | scrape_labels for n, labels in exposed_labels(VLLM_FIXTURE.read_text()).items()},
    }
    for group in rule_groups(config)["groups"]:
        exposed = sources[group["name"]]
        for rule in group["rules"]:
            used = metric_names(rule["expr"])
            assert used and used <= set(exposed), (rule["alert"], used - set(exposed))
            assert grouping_labels(rule["expr"]) <= set.union(*(exposed[n] for n in used)), rule["alert"]
    for test in unit_tests(config)["tests"]:
        for series in test["input_series"]:
            metric, labels = re.fullmatch(r"([^{]+)\{(.*)\}", series["series"]).groups()
            group = VLLM_GROUP if metric.startswith("vllm:") else GROUP
            assert set(re.findall(r'(\w+)="', labels)) <= sources[group][metric], series["series"]


def test_unexportable_rules_raise_rules_error():
    arm = {
        "name": "ByArm",
        "signal": "acceptance_rate",
        "op": "<",
        "threshold": 0.5,
        "window": "5m",
        "group_by": ["arm"],
    }
    with pytest.raises(RulesError, match=r"ByArm: signal acceptance_rate cannot be grouped by \['arm'\]"):
        rule_groups(parse_config({"rules": [arm]}))
    never = {**arm, "name": "Never", "op": ">", "threshold": 1.0, "group_by": []}
    with pytest.raises(RulesError, match="Never: cannot fire"):
        unit_tests(parse_config({"rules": [never]}))
    taken = [{**arm, "name": "Low", "group_by": []}, {**arm, "name": "VllmLow", "signal": "oom_count", "op": ">"}]
    with pytest.raises(RulesError, match="VllmLow is taken"):
        rule_groups(parse_config({"rules": [{**r, "group_by": []} for r in taken]}))
