"""Configurations where acceptance is not what it seems (collector.reads.acceptance_modes): lossy
verification and forced acceptance, read from config events; the acceptance alerts, the drift detector
and the activity endpoint treat those instances' acceptance as saying nothing about the drafter."""

from __future__ import annotations

import pytest
from collector_payloads import T0, event_dict, request_dict

from specwatch.alerts.baselines import run_pass
from specwatch.alerts.detector_settings import DriftSettings
from specwatch.alerts.detector_store import series_rows
from specwatch.alerts.signals import StoreSignals
from specwatch.collector.ingest.store import Store
from specwatch.collector.reads.acceptance_modes import FORCED, LOSSY, acceptance_mode
from specwatch.collector.reads.queries import Window
from specwatch.collector.reads.speculation import speculation_activity
from specwatch.telemetry.schema import IngestBatch


@pytest.mark.parametrize(
    ("detail", "mode"),
    [
        ({"speculative_config": {"method": "ngram", "rejection_sample_method": "fly"}}, LOSSY),
        ({"speculative_config": {"method": "synthetic", "num_speculative_tokens": 3}}, FORCED),
        # vLLM 0.33.0 (vllm/config/speculative.py): synthetic is a rejection_sample_method, with its rates
        ({"speculative_config": {"rejection_sample_method": "synthetic", "synthetic_acceptance_length": 2.5}}, FORCED),
        ({"env": {"SGLANG_SIMULATE_ACC_LEN": "3.2"}}, FORCED),
        ({"env": [{"TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS": 2}]}, FORCED),
        ({"env": {"TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS": "0"}}, None),  # unset
        ({"speculative_config": {"method": "ngram", "rejection_sample_method": "strict"}}, None),
        ({"drafter": "ngram", "version": "0.1"}, None),
    ],
)
def test_modes_from_a_config_detail(detail, mode):
    assert acceptance_mode(detail) == mode


def store(db, requests=(), events=()) -> None:
    Store(db).insert(IngestBatch.model_validate({"requests": list(requests), "events": list(events)}))


def test_a_forced_instance_neither_alerts_nor_learns_a_baseline(db):
    forced = {"drafter": "ngram", "speculative_config": {"method": "synthetic"}}
    events = [
        event_dict(0, instance="forced", at=T0 - 10, kind="config", detail=forced),
        event_dict(1, instance="plain-truth", at=T0 - 10, kind="config", detail={"drafter": "ngram"}),
    ]
    low = dict(accepted_per_position=[1, 0, 0, 0], num_accepted_tokens=1)  # acceptance 1/16: would fire
    requests = [request_dict(i, instance=("forced", "plain-truth")[i % 2], **low) for i in range(40)]
    store(db, requests, events)
    for signal in ("acceptance_rate", "conditional_acceptance"):
        readings = {dict(r.labels)["instance"]: r for r in StoreSignals(db).query(signal, 300, ["instance"], T0 + 60)}
        assert not readings["forced"].significant and readings["plain-truth"].significant, signal
    run_pass(db, DriftSettings(min_drafted_tokens=1), T0 + 60)
    fed = {dict(row.labels)["instance"] for row in series_rows(db, "drift")}
    assert fed == {"plain-truth"}
    activity = {a.instance: a.acceptance_mode for a in speculation_activity(db, Window(T0, T0 + 60))}
    assert activity == {"forced": FORCED, "plain-truth": None}
