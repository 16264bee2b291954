"""The canary decision rule (alerts.canary_verdict), table-driven, and `specwatch tune canary`'s bad input."""

from __future__ import annotations

import subprocess

import pytest

from specwatch.alerts.canary_verdict import Arm, CanaryRules, decide
from specwatch.common.procs import specwatch_command
from specwatch.tune_canary import Loads, arms_of

RULES = CanaryRules(alpha=0.05, min_requests=20, max_load_gap=0.25, max_error_gap=0.02)
FAST, SLOW = Arm(30, 0, 0.020, 0.5), Arm(30, 0, 0.030, 0.5)


@pytest.mark.parametrize(
    ("candidate", "control", "speedup", "p", "decision", "why"),
    [
        (FAST, SLOW, 1.5, 0.001, "promote", "significantly faster"),
        (SLOW, FAST, 0.67, 0.001, "rollback", "significantly slower"),
        (FAST, SLOW, 1.5, 0.2, "rollback", "no significant difference"),
        (FAST, SLOW, 1.5, 0.05, "rollback", "no significant difference"),  # p must be below alpha
        (Arm(21, 2, 0.02, 0.5), SLOW, 1.5, 0.001, "rollback", "not enough data (19 candidate"),
        (FAST, Arm(30, 0, 0.03, 0.9), 1.5, 0.001, "rollback", "load not matched (candidate 0.50, control 0.90"),
        (FAST, Arm(30, 0, 0.03, 0.75), 1.5, 0.001, "promote", "significantly faster"),  # 0.25 apart: matched
        (Arm(30, 0, 0.02), SLOW, 1.5, 0.001, "promote", "significantly faster"),  # loads never sampled
        (Arm(30, 3, 0.02, 0.5), SLOW, 1.5, 0.001, "rollback", "candidate errors 10.0% against control 0.0%"),
        (FAST, SLOW, None, None, "rollback", "no comparison"),
    ],
)
def test_decision(candidate, control, speedup, p, decision, why):
    verdict = decide(candidate, control, speedup, p, RULES)
    assert verdict.decision == decision and why in verdict.reason
    assert verdict.share_after == (1.0 if decision == "promote" else 0.0)


def test_rules_are_validated():
    for bad in ({"alpha": 0.0}, {"alpha": 1.0}, {"min_requests": 1}, {"max_load_gap": -0.1}):
        with pytest.raises(ValueError):
            CanaryRules(**bad)


def test_arms_from_a_comparison_and_sampled_loads():
    loads = Loads()
    loads.add({"upstreams": [{"pool": "spec", "healthy": True, "load": 0.5}, {"pool": "plain", "healthy": True,
               "load": 1.0}, {"pool": "plain", "healthy": False, "load": 9.0}]})  # fmt: skip
    loads.add({"upstreams": [{"pool": "spec", "healthy": True, "load": 0.0}, {"pool": "plain", "healthy": True,
               "load": 0.5}]})  # fmt: skip
    spec = {"requests": 12, "errors": 1, "s_per_token_mean": 0.02}
    arms = arms_of({"speculative": spec, "plain": None}, loads)
    assert arms["candidate"] == Arm(12, 1, 0.02, 0.25) and arms["candidate"].ok == 11
    assert arms["control"] == Arm(0, 0, None, 0.75)
    assert arms["candidate"].as_detail() == {
        "requests": 12, "errors": 1, "ms_per_token": 20.0, "tokens_per_s": 50.0, "load": 0.25
    }  # fmt: skip


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--share", "0"], "strictly between 0 and 1"),
        (["--share", "1.5"], "strictly between 0 and 1"),
        (["--min-requests", "x"], "want a positive number"),
        (["--alpha", "2"], "alpha must be between 0 and 1"),
        (["--collector", "ftp://x"], "--collector: want an http(s)://HOST[:PORT] URL"),
        (["--gateway", "http://127.0.0.1:9"], "gateway: cannot reach http://127.0.0.1:9/v1/control/state"),
    ],
)
def test_bad_input_exits_2_with_one_line(args, message):
    base = {"--gateway": "http://127.0.0.1:9", "--collector": "http://127.0.0.1:9"}
    for flag in args[::2]:
        base.pop(flag, None)
    cmd = specwatch_command("tune", "canary", *[x for kv in base.items() for x in kv], *args)
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and message in done.stderr, done.stderr
