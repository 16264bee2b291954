"""/metrics stays bounded whatever producers send (issue 53 #2: 100,000 distinct model names grew it to
1.2 GB): label sets past the tenant, instance and fleet caps fold into `other`, counted, sums whole."""

from __future__ import annotations

import orjson
from collector_payloads import request_dict, sample_dict
from prometheus_client.parser import text_string_to_metric_families

from specwatch.collector.label_budget import OTHER, LabelBudget, LabelLimits

JSON = {"content-type": "application/json"}
MAX_METRICS_BYTES = 5_000_000  # docs/collector.md: the bound at the default caps is well under this


def test_each_cap_folds_what_passes_it_and_counts_it():
    budget = LabelBudget(LabelLimits(label_sets=5, per_instance=3, per_tenant=2, devices=1))
    assert budget.labels("a", "m1", "speculative", "ngram", "acme", 1) == ("a", "m1", "speculative", "ngram")
    assert budget.labels("a", "m2", "speculative", "ngram", "acme", 1) == ("a", "m2", "speculative", "ngram")
    # acme has created its 2; a third of its own folds, while an existing set still takes its requests
    assert budget.labels("a", "m3", "speculative", "ngram", "acme", 5) == ("a", OTHER, "speculative", OTHER)
    assert budget.labels("a", "m1", "speculative", "ngram", "acme", 1) == ("a", "m1", "speculative", "ngram")
    assert budget.labels("a", "m3", "speculative", "ngram", "globex", 1) == ("a", "m3", "speculative", "ngram")
    # instance a holds 3 of its own: a fourth folds, whoever sends it
    assert budget.labels("a", "m4", "speculative", "ngram", None, 2) == ("a", OTHER, "speculative", OTHER)
    assert budget.labels("b", "m1", "autoregressive", "none", None, 1) == ("b", "m1", "autoregressive", "none")
    # 5 label sets exist (a's `other` counts): the fleet is full, a new instance folds whole
    assert budget.labels("c", "m1", "speculative", "ngram", None, 7) == (OTHER, OTHER, "speculative", OTHER)
    assert budget.device("a", "cuda:0") == ("a", "cuda:0") and budget.device("a", "cuda:1") == (OTHER, OTHER)
    assert dict(budget.folded) == {"tenant": 5, "instance": 2, "fleet": 7, "device": 1}


def families(client) -> dict:
    return {f.name: f for f in text_string_to_metric_families(client.get("/metrics").text)}


def test_thousands_of_model_names_keep_metrics_bounded_and_sums_whole(client):
    flood = [request_dict(i, request_id=f"x-{i}", model=f"m-{i}", tags={"tenant": "acme"}) for i in range(3000)]
    other_tenant = request_dict(1, request_id="g-1", instance="gpu-1", model="kept", tags={"tenant": "globex"})
    for first in range(0, len(flood), 500):  # the test body cap: 256 KiB
        body = orjson.dumps({"requests": flood[first : first + 500]})
        assert client.post("/v1/ingest", content=body, headers=JSON).status_code == 200
    devices = [sample_dict(i, device=f"d-{i}") for i in range(200)]
    body = orjson.dumps({"requests": [other_tenant], "samples": devices})
    assert client.post("/v1/ingest", content=body, headers=JSON).status_code == 200
    scraped = client.get("/metrics")
    assert len(scraped.content) < MAX_METRICS_BYTES
    found = families(client)
    output = found["specwatch_output_tokens"].samples
    assert sum(s.value for s in output) == 64 * 3001  # folded requests still count
    models = {s.labels["model"] for s in output}
    limits = LabelLimits()
    assert len(models - {OTHER, "kept"}) == limits.per_tenant  # acme's own, then `other`
    assert ("gpu-1", "kept") in {(s.labels["instance"], s.labels["model"]) for s in output}  # globex unharmed
    folded = {s.labels["cap"]: s.value for s in found["specwatch_metrics_folded_requests"].samples}
    assert folded["tenant"] == 3000 - limits.per_tenant and folded["device"] == 200 - limits.devices
    reserved = found["specwatch_device_memory_reserved_bytes"].samples
    assert len(reserved) == limits.devices + 1
