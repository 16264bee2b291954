"""The `spec_cost_excess` signal over a real store and the shipped `SpeculationCostsMore` rule.

Hand-made records: plain requests at 0.01 device-s per output token, speculative ones 10% dearer,
so the signal must read 0.10; records that must not count (failed, no device_s, outside the
window) carry costs that would move it if they did.
"""

from __future__ import annotations

import pytest
from collector_payloads import T0, plain_request_dict, request_dict
from test_alert_evaluator import run_table

from specwatch.alerts.evaluator import State, evaluate
from specwatch.alerts.rules import DEFAULT_RULES, load_config
from specwatch.alerts.signals import StoreSignals
from specwatch.collector.ingest.store import Store
from specwatch.telemetry.schema import IngestBatch

HOUR = 3600.0
NOW = T0 + HOUR
TOKENS = 64


def timed(record: dict, per_token_s: float) -> dict:
    return {**record, "output_tokens": TOKENS, "device_s": per_token_s * TOKENS, "device_s_source": "engine"}


def arms(n_spec: int, n_plain: int, spec_per_token: float = 0.011, instance: str = "gpu-0", first: int = 0) -> list:
    """`n_spec` speculative and `n_plain` plain requests in the hour before NOW, ids from `first` up."""
    at = {"instance": instance}
    spec = [timed(request_dict(first + i, started_at=T0 + i, **at), spec_per_token) for i in range(n_spec)]
    plain = [timed(plain_request_dict(first + 1000 + i, started_at=T0 + i, **at), 0.01) for i in range(n_plain)]
    return spec + plain


def not_counted() -> list[dict]:
    """A failed speculative request, one without device_s, and one an hour and more ago: all dear."""
    failed = {**timed(request_dict(5000), 1.0), "status": "error", "error": "target:oom"}
    untimed = request_dict(5001, output_tokens=TOKENS)
    old = timed(request_dict(5002, started_at=NOW - HOUR - 1), 1.0)
    return [failed, untimed, old]


def store(db, records: list[dict]) -> None:
    Store(db).insert(IngestBatch.model_validate({"requests": records}))


def shipped_rule():
    return load_config(DEFAULT_RULES).rule("SpeculationCostsMore")


def test_spec_ten_percent_dearer_reads_0_10_per_instance(db):
    store(db, arms(60, 60) + arms(50, 70, spec_per_token=0.009, instance="gpu-1", first=10_000) + not_counted())
    samples = {
        dict(s.labels)["instance"]: s for s in StoreSignals(db).query("spec_cost_excess", HOUR, ["instance"], NOW)
    }
    assert samples["gpu-0"].value == pytest.approx(0.10) and samples["gpu-0"].count == 60
    assert samples["gpu-1"].value == pytest.approx(-0.10) and samples["gpu-1"].count == 50  # the smaller mode
    (overall,) = StoreSignals(db).query("spec_cost_excess", HOUR, [], NOW)
    assert overall.value == pytest.approx((60 * 0.011 + 50 * 0.009) / 110 / 0.01 - 1) and overall.count == 110


def test_one_mode_alone_gives_no_sample(db):
    store(db, arms(60, 0))
    assert StoreSignals(db).query("spec_cost_excess", HOUR, ["instance", "model"], NOW) == []


def test_the_shipped_rule_goes_pending_from_the_store_only_with_50_requests_each(db):
    rule = shipped_rule()
    assert (rule.op, rule.threshold, rule.window, rule.min_samples) == (">", 0.05, HOUR, 50)
    store(db, arms(49, 80) + not_counted())
    source = StoreSignals(db)
    (few,) = source.query(rule.signal, rule.window, rule.group_by, NOW)
    assert few.value == pytest.approx(0.10) and few.count == 49
    assert evaluate(NOW, rule, [few], {}).alerts == {}  # 49 speculative requests: below the minimum
    store(db, arms(1, 0, first=49))
    outcome = evaluate(NOW, rule, source.query(rule.signal, rule.window, rule.group_by, NOW), {})
    (alert,) = outcome.alerts.values()
    assert alert.state == State.PENDING and alert.labels["instance"] == "gpu-0"
    assert "0.1 more device time per output token" in alert.annotations["summary"]


def test_the_shipped_rule_table():
    """5 minutes pending, then firing; a request count under 50 is no data, and 5% is not above 5%."""
    run_table(
        shipped_rule(),
        [
            (0, 0.04, "-"),
            (15, 0.10, "pending"),
            (300, 0.10, "pending"),  # active 285 s < for 300 s
            (315, 0.12, "firing"),
            (330, 0.20, "inactive", 49),  # too few requests in a mode: resolves
            (345, 0.10, "pending"),
            (360, 0.05, "-"),  # not above the threshold: a pending alert is dropped
        ],
    )
