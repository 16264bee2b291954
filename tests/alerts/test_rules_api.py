"""`GET /v1/rules`: the rules the collector evaluates, as loaded from its rules file at start-up."""

from __future__ import annotations

from pathlib import Path

import yaml
from fastapi.testclient import TestClient

from specwatch.alerts.rules import DEFAULT_RULES, load_config
from specwatch.service.app import create_app


def rules_file(folder: Path, **thresholds: float) -> Path:
    """The shipped rules with the named rules' thresholds changed."""
    data = yaml.safe_load(DEFAULT_RULES.read_text())
    for rule in data["rules"]:
        rule["threshold"] = thresholds.get(rule["name"], rule["threshold"])
    path = folder / "rules.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def get_rules(settings, registry) -> dict:
    with TestClient(create_app(settings, registry)) as client:
        response = client.get("/v1/rules")
    assert response.status_code == 200, response.text
    return response.json()


def test_rules_are_the_ones_in_the_collectors_rules_file(settings, registry, tmp_path):
    path = rules_file(tmp_path, TTFTP99High=1.0, SpecAcceptanceLow=0.45)
    found = get_rules(settings.model_copy(update={"alert_rules": path}), registry)
    assert found["enabled"] is True and found["evaluation_interval_s"] == 15.0
    by_name = {rule["name"]: rule for rule in found["rules"]}
    assert list(by_name) == [rule.name for rule in load_config(path).rules]
    assert by_name["TTFTP99High"] | {"summary": ""} == {
        "name": "TTFTP99High",
        "signal": "ttft_p99",
        "definition": None,
        "unit": "seconds",
        "op": ">",
        "threshold": 1.0,
        "window_s": 300.0,
        "for_s": 60.0,
        "keep_firing_for_s": 0.0,
        "min_samples": 20,
        "group_by": ["instance", "model"],
        "labels": {"severity": "critical"},
        "summary": "",
        "actions": ["fallback_autoregressive"],
    }
    assert (by_name["SpecAcceptanceLow"]["op"], by_name["SpecAcceptanceLow"]["threshold"]) == ("<", 0.45)
    assert by_name["SpecAcceptanceLow"]["definition"].startswith("acceptance rate (the mean")  # the glossary's term


def test_without_a_rules_file_the_shipped_rules_apply(client):
    by_name = {rule["name"]: rule for rule in client.get("/v1/rules").json()["rules"]}
    assert by_name["TTFTP99High"]["threshold"] == 0.3
    assert by_name["MemoryFragmentationHigh"]["threshold"] == 1.2


def test_with_alerting_off_no_rule_is_evaluated(settings, registry):
    found = get_rules(settings.model_copy(update={"alerts_enabled": False}), registry)
    assert found == {"enabled": False, "evaluation_interval_s": None, "rules": []}
