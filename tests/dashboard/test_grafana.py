"""The Grafana dashboards (dashboard/grafana/): well-formed, built from build.py, and every metric
their PromQL reads is one the collector (or vLLM, via FakeVllm) really exposes."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from collector_payloads import plain_request_dict, request_dict, sample_dict
from fake_vllm import FakeVllm
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from specwatch.alerts.rules import DEFAULT_RULES, load_config, parse_config
from specwatch.collector.ingest.store import IngestCounts
from specwatch.collector.metrics import CollectorMetrics
from specwatch.dashboard.grafana.build import SOURCES, dashboard, rule_thresholds
from specwatch.telemetry.schema import DeviceSample, RequestRecord

GRAFANA = Path(__file__).resolve().parents[2] / "dashboard" / "grafana"
FILES = ("specwatch.json", "specwatch-vllm.json")
NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
SELECTOR = re.compile(r"((?:specwatch_|vllm:)[a-zA-Z0-9_:]*)(\{[^}]*\})?")
TITLES = {
    "specwatch.json": {
        "Requests/s",
        "Output tokens/s",
        "Acceptance rate",
        "Mean acceptance length",
        "Drafted & accepted tokens/s",
        "Share of output tokens from accepted drafts",
        "Acceptance rate by drafter",
        "Per-request acceptance stddev",
        "Time to first token P50 / P99",
        "End-to-end latency P99",
        "Fragmentation ratio",
        "Memory reserved",
        "Power",
        "Draft model utilisation",
    },
    "specwatch-vllm.json": {
        "Requests/s",
        "Acceptance rate",
        "Mean acceptance length",
        "Drafted & accepted tokens/s",
        "Acceptance by draft position",
        "Time to first token P50 / P99",
        "End-to-end latency P99",
    },
}
ROWS = {
    "specwatch.json": ["Overview", "Acceptance", "Latency", "Memory"],
    "specwatch-vllm.json": ["Overview", "Acceptance", "Latency"],
}
THRESHOLDS = {
    "Acceptance rate": 0.6,
    "Acceptance rate by drafter": 0.6,
    "Per-request acceptance stddev": 0.15,
    "Time to first token P50 / P99": 0.3,
    "Fragmentation ratio": 1.2,
}


def load(file: str) -> dict:
    return json.loads((GRAFANA / file).read_text())


def queries(dashboard: dict, variables: bool = True) -> list[str]:
    """The PromQL the dashboard runs: panel targets and (optionally) the variables' label_values queries."""
    exprs = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    return exprs + [v["query"]["query"] for v in dashboard["templating"]["list"] if variables and v["type"] == "query"]


def exposed(text: str) -> set[str]:
    return {s.name for family in text_string_to_metric_families(text) for s in family.samples}


@pytest.mark.parametrize("file", FILES)
def test_files_are_what_build_py_writes(file):
    fresh = json.loads(json.dumps(dashboard(SOURCES[file], load_config(DEFAULT_RULES))))
    assert load(file) == fresh, "stale: run python -m specwatch.grafana"


def test_thresholds_come_from_the_loaded_rules_their_side_from_the_op():
    """The rule that fires first sets the line; red on the side where it fires."""
    rule = {"name": "R", "signal": "acceptance_rate", "window": "5m", "summary": "s"}
    config = parse_config(
        {"rules": [{**rule, "op": "<", "threshold": 0.5}, {**rule, "name": "S", "op": "<", "threshold": 0.4}]}
    )
    assert rule_thresholds(config) == {"acceptance_rate": (0.5, "below")}
    config = parse_config({"rules": [{**rule, "op": ">", "threshold": 0.9}]})
    panels = {p["title"]: p for p in dashboard(SOURCES["specwatch.json"], config)["panels"]}
    steps = panels["Acceptance rate"]["fieldConfig"]["defaults"]["thresholds"]["steps"]
    assert steps == [{"color": "green", "value": None}, {"color": "red", "value": 0.9}]


def test_thresholds_follow_the_rules_file(tmp_path):
    """`python -m specwatch.grafana --rules FILE`: each panel draws its rule's threshold, and none where no
    rule watches the signal; a bad rules file exits 2."""
    rules = yaml.safe_load((GRAFANA.parents[1] / "alerts" / "default_rules.yaml").read_text())
    changed = {"acceptance_rate": 0.45, "ttft_p99": 1.0, "vllm_ttft_p99": 2.5}
    rules["rules"] = [
        rule | ({"threshold": changed[rule["signal"]]} if rule["signal"] in changed else {})
        for rule in rules["rules"]
        if rule["signal"] != "fragmentation"
    ]
    (tmp_path / "rules.yaml").write_text(yaml.safe_dump(rules))
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "-m", "specwatch.grafana", "--rules", str(tmp_path / "rules.yaml"), "--out", str(out)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr

    def lines(file: str) -> dict[str, list]:
        panels = json.loads((out / file).read_text())["panels"]
        steps = {p["title"]: p["fieldConfig"]["defaults"]["thresholds"]["steps"] for p in panels if p["type"] != "row"}
        return {title: [step["value"] for step in s] for title, s in steps.items()}

    ours, vllm = lines("specwatch.json"), lines("specwatch-vllm.json")
    assert ours["Acceptance rate"] == [None, 0.45] and ours["Time to first token P50 / P99"] == [None, 1.0]
    assert ours["Fragmentation ratio"] == [None]  # no rule on fragmentation: no line
    assert vllm["Time to first token P50 / P99"] == [None, 2.5] and vllm["Acceptance rate"] == [None, 0.6]
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules: [{name: X}]\n")
    refused = subprocess.run(
        [sys.executable, "-m", "specwatch.grafana", "--rules", str(bad), "--out", str(out)],
        capture_output=True,
        text=True,
    )
    assert refused.returncode == 2 and "cannot read the alert thresholds" in refused.stderr


@pytest.mark.parametrize("file", FILES)
def test_dashboard_structure(file):
    d = load(file)
    assert d["schemaVersion"] == 39 and d["uid"]
    variables = {v["name"]: v for v in d["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    assert all(variables[n]["query"]["query"].startswith("label_values(") for n in ("instance", "model"))
    panels = d["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    assert [p["title"] for p in panels if p["type"] == "row"] == ROWS[file]
    assert TITLES[file] <= {p["title"] for p in panels}
    cells: dict[tuple[int, int], str] = {}
    for p in panels:
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24 and g["h"] > 0
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, f"{p['title']} overlaps {cells[(x, y)]}"
                cells[(x, y)] = p["title"]
        if p["type"] == "row":
            continue
        assert p["type"] in ("timeseries", "stat") and p["targets"]
        assert all(t["datasource"]["uid"] == "${datasource}" for t in p["targets"])
        defaults = p["fieldConfig"]["defaults"]
        assert defaults["unit"] in ("s", "percentunit", "none", "bytes", "watt", "reqps")
        assert defaults["thresholds"]["mode"] == "absolute"
        steps = defaults["thresholds"]["steps"]
        if p["title"] in THRESHOLDS:  # red above the alert value, or red below it (green from it on)
            assert [s["value"] for s in steps] == [None, THRESHOLDS[p["title"]]], p["title"]
            assert {s["color"] for s in steps} == {"red", "green"}, p["title"]
        if p["type"] == "timeseries":
            drawn = defaults["custom"]["thresholdsStyle"]["mode"]
            assert drawn == ("line" if p["title"] in THRESHOLDS else "off"), p["title"]


@pytest.mark.parametrize("file", FILES)
def test_every_selector_is_filtered_by_instance_and_model(file):
    model = 'model_name=~"$model"' if "vllm" in file else 'model=~"$model"'
    for expr in queries(load(file), variables=False):
        for metric, selector in SELECTOR.findall(expr):
            assert 'instance=~"$instance"' in selector, expr
            assert metric.startswith("specwatch_device_") or model in selector, expr  # device gauges carry no model


def collector_exposition() -> str:
    metrics = CollectorMetrics(CollectorRegistry())
    rows = [request_dict(i, arm=("spec", "control")[i % 2]) for i in range(6)]
    rows += [
        plain_request_dict(
            10,
            status="error",
            error="draft:oom",
        )
    ]
    metrics.record_batch(
        IngestCounts(
            requests=len(rows),
            samples=1,
            new_requests=tuple(RequestRecord.model_validate(r) for r in rows),
            new_samples=(DeviceSample.model_validate(sample_dict(0, util_draft=0.3)),),
        )
    )
    return generate_latest(metrics.registry).decode()


def vllm_exposition() -> str:
    vllm = FakeVllm(gamma=3)
    for accepted in (0, 1, 3):
        vllm.observe_draft(accepted)
    vllm.observe_request(ttft=0.05, e2e=1.2)
    return vllm.text()


@pytest.mark.parametrize(
    ("file", "prefix", "exposition"),
    [("specwatch.json", "specwatch_", collector_exposition), ("specwatch-vllm.json", "vllm:", vllm_exposition)],
)
def test_promql_reads_only_exposed_metrics(file, prefix, exposition):
    names = exposed(exposition())
    used = {token for expr in queries(load(file)) for token in NAME.findall(expr) if token.startswith(prefix)}
    assert used and used <= names, sorted(used - names)
    if prefix == "specwatch_":  # the panels cover the per-request and device metrics the brief names
        assert {
            "specwatch_oom_errors_total",
            "specwatch_device_util_draft_ratio",
            "specwatch_acceptance_rate_squares_total",
        } <= used


def concrete(expr: str) -> str:
    """Grafana's variables replaced by values Prometheus accepts."""
    for variable, value in (("$__rate_interval", "5m"), ("$__range", "1h"), ("$instance", ".*"), ("$model", ".*")):
        expr = expr.replace(variable, value)
    return expr


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not found: apt-get install prometheus")
@pytest.mark.parametrize("file", FILES)
def test_promql_parses_with_promtool(file, tmp_path):
    exprs = queries(load(file), variables=False)
    rules = [{"record": f"dashboard:panel_{i}", "expr": concrete(e)} for i, e in enumerate(exprs)]
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}))
    result = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(rules)} rules found" in result.stdout
