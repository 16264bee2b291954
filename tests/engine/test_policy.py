"""The speculation policy, stepped through (time, input, expected decision) tables with no sleeps."""

from __future__ import annotations

import time

import pytest

from specwatch.engine.policy import Choice, Decision, Policy, PolicyConfig
from specwatch.telemetry.schema import EngineEvent, RequestRecord
from specwatch.telemetry.sink import TelemetrySink


def record(drafter: str, drafted: int, accepted: int) -> RequestRecord:
    return RequestRecord(
        request_id=f"r{time.monotonic_ns()}",
        instance="i",
        model="m",
        drafter=drafter,
        mode="speculative",
        started_at=time.time(),
        e2e_s=1.0,
        prompt_tokens=10,
        output_tokens=accepted + 1,
        num_drafts=1,
        num_draft_tokens=drafted,
        num_accepted_tokens=accepted,
        accepted_per_position=[1] * accepted + [0] * (drafted - accepted),
        gamma=drafted,
    )


def timed_record(drafter: str | None, tokens: int, busy_s: float) -> RequestRecord:
    gamma = 4 if drafter else 0
    return RequestRecord(
        request_id=f"g{time.monotonic_ns()}",
        instance="i",
        model="m",
        drafter=drafter,
        mode="speculative" if drafter else "autoregressive",
        started_at=time.time(),
        e2e_s=busy_s + 0.1,
        prompt_tokens=10,
        output_tokens=tokens,
        verify_s=busy_s,
        gamma=gamma,
        accepted_per_position=[0] * gamma,
    )


def test_load_switch_has_hysteresis_and_cooldown():
    sink, events = TelemetrySink("i"), []
    sink.subscribe(EngineEvent, events.append)
    policy = Policy(PolicyConfig(load_off=0.75, load_on=0.6, cooldown_s=5.0, min_window=2), sink=sink)
    for _ in range(2):  # measured: plain decoding beats this drafter, so high load switches it off
        policy.observe(timed_record("ngram", 11, 1.0))
        policy.observe(timed_record(None, 41, 1.0))
    steps = [  # (t, load, expected speculate, reason)
        (0.0, 0.50, True, "default"),
        (1.0, 0.80, False, "load"),  # above 0.75: off
        (2.0, 0.70, False, "load"),  # between the thresholds: stays off
        (3.0, 0.50, False, "load"),  # below 0.6 but within the 5 s cool-down
        (7.0, 0.50, True, "default"),  # cool-down over: back on
        (8.0, 0.70, True, "default"),  # between the thresholds: stays on
    ]
    switched = []  # (t, mode) of each mode_switch event, as the policy emits it
    for t, load, speculate, reason in steps:
        assert policy.decide(100, load, "ngram", now=t) == Decision(speculate, reason), (t, load)
        switched += [(t, e.detail["to"]) for e in events[len(switched) :]]
    assert switched == [(1.0, "autoregressive"), (7.0, "speculative")]
    assert {(e.kind, e.instance, e.detail["reason"]) for e in events} == {("mode_switch", "i", "load")}


def test_long_prompts_and_plain_requests_do_not_speculate():
    policy = Policy(PolicyConfig(long_prompt_tokens=512))
    assert policy.decide(513, 0.0, "ngram", now=0) == Decision(False, "long_prompt")
    assert policy.decide(512, 0.0, "ngram", now=0) == Decision(True, "default")
    assert policy.decide(10, 0.0, None, now=0) == Decision(False, "default")


def test_override_wins_until_released():
    sink, events = TelemetrySink("i"), []
    sink.subscribe(EngineEvent, events.append)
    policy = Policy(sink=sink)
    policy.set_override("autoregressive", "alert")
    assert [(e.kind, e.detail["to"], e.detail["reason"]) for e in events] == [
        ("mode_switch", "autoregressive", "alert")
    ]
    assert policy.decide(10, 0.0, "ngram", now=0) == Decision(False, "alert")
    policy.set_override("auto")
    assert policy.decide(10, 0.0, "ngram", now=0) == Decision(True, "default")


def test_canary_splits_traffic_into_arms():
    policy = Policy(PolicyConfig(canary_fraction=0.05), seed=1)
    decisions = [policy.decide(10, 0.0, "ngram", now=0) for _ in range(4000)]
    spec = sum(d.arm == "spec" for d in decisions)
    assert all(d.reason == "canary" and d.speculate == (d.arm == "spec") for d in decisions)
    assert 120 < spec < 280  # 5% of 4000 = 200


def test_low_acceptance_falls_back_and_probes():
    policy = Policy(PolicyConfig(min_acceptance=0.3, min_window=4, probe_every=4))
    for _ in range(4):
        policy.observe(record("early-exit:4", 8, 1))
    decisions = [policy.decide(10, 0.0, "early-exit:4", now=0) for _ in range(8)]
    assert [d.speculate for d in decisions] == [False, False, False, True] * 2
    assert decisions[0].reason == "low_acceptance"
    assert policy.decide(10, 0.0, "ngram", now=0).speculate  # per drafter


def test_bad_config_is_rejected():
    with pytest.raises(ValueError):
        PolicyConfig(load_on=0.9, load_off=0.75)
    with pytest.raises(ValueError):
        PolicyConfig(canary_fraction=1.5)


def test_under_load_a_drafter_measured_to_pay_keeps_speculating():
    policy = Policy(PolicyConfig(min_window=4, probe_every=5, cooldown_s=0.0))
    for _ in range(4):
        policy.observe(timed_record("ngram", 101, 1.0))  # 100 tokens per busy second
        policy.observe(timed_record(None, 41, 1.0))  # plain: 40
        policy.observe(timed_record("early-exit:4", 21, 1.0))  # a losing drafter: 20
    decisions = [policy.decide(10, 0.9, "ngram", now=10.0) for _ in range(40)]
    # 2.5x better than plain is conclusive: a plain probe every 4 x 5 = 20 requests
    assert [d.speculate for d in decisions] == ([True] * 19 + [False]) * 2
    assert {d.reason for d in decisions if not d.speculate} == {"load"}
    assert policy.decide(10, 0.9, "early-exit:4", now=11.0) == Decision(False, "load")


def test_under_load_unmeasured_speculation_continues_while_plain_probes_collect_evidence():
    policy = Policy(PolicyConfig(cooldown_s=0.0, min_window=2, probe_every=3))
    decisions = [policy.decide(10, 0.9, "ngram", now=float(t)).speculate for t in range(6)]
    assert decisions == [True, True, False, True, True, False]
    for _ in range(2):
        policy.observe(timed_record("ngram", 11, 1.0))  # measured: 10 tokens/s
        policy.observe(timed_record(None, 41, 1.0))  # plain: 40 tokens/s
    assert policy.decide(10, 0.9, "ngram", now=7.0) == Decision(False, "load")


def test_candidates_parse_and_bad_ones_are_rejected():
    assert [str(Choice.parse(c)) for c in ("none", "ngram", "ngram@16", "early-exit:4@2")] == [
        "none",
        "ngram@8",
        "ngram@16",
        "early-exit:4@2",
    ]
    for bad in ("ngram@0", "ngram@x", "ngram@65"):
        with pytest.raises(ValueError, match="gamma"):
            PolicyConfig(candidates=("none", bad))


def selected_record(choice: Choice, scenario: str, tokens: int, busy_s: float) -> RequestRecord:
    gamma = choice.gamma
    return RequestRecord(
        request_id=f"s{time.monotonic_ns()}",
        instance="i",
        model="m",
        drafter=choice.drafter,
        mode="speculative" if choice.drafter else "autoregressive",
        mode_reason="selected",
        started_at=time.time(),
        e2e_s=busy_s,
        prompt_tokens=10,
        output_tokens=tokens,
        verify_s=busy_s,
        gamma=gamma,
        accepted_per_position=[0] * gamma,
        tags={"scenario": scenario},
    )


def test_selector_settles_per_scenario_on_the_best_goodput():
    """Grounded text pays for long n-gram drafts, open chat for plain decoding: the bandit learns both."""
    goodput = {
        "grounded": {"none": 25, "ngram@4": 45, "ngram@8": 60, "ngram@16": 70},
        "chat": {"none": 25, "ngram@4": 20, "ngram@8": 18, "ngram@16": 15},
    }
    policy = Policy(PolicyConfig(explore=0.1), seed=3)
    picks = {scenario: [] for scenario in goodput}
    for _ in range(200):
        for scenario, table in goodput.items():
            choice = policy.choose(scenario)
            picks[scenario].append(str(choice))
            policy.observe(selected_record(choice, scenario, 1 + table[str(choice)], 1.0), choice)
    assert policy.selector.best("grounded") == Choice("ngram", 16) and policy.selector.best("chat") == Choice(None, 0)
    late = {s: p[-100:] for s, p in picks.items()}
    assert late["grounded"].count("ngram@16") >= 80 and late["chat"].count("none") >= 80  # ~90% exploit, 10% explore
    assert set(picks["chat"]) == set(goodput["chat"])  # every candidate was tried
    assert policy.state["selector"]["grounded"]["ngram@16"]["goodput"] == pytest.approx(70)


def test_a_choice_the_policy_overruled_is_credited_to_plain_decoding():
    policy = Policy(PolicyConfig(candidates=("none", "ngram@8")))
    ran_plain = selected_record(Choice(None, 0), "chat", 11, 1.0)
    policy.observe(ran_plain, Choice("ngram", 8))  # asked for ngram@8, the load rule made it decode plainly
    assert policy.state["selector"]["chat"] == {
        "none": {"requests": 1, "goodput": 10.0},
        "ngram@8": {"requests": 0, "goodput": None},
    }


def test_a_retried_request_credits_no_goodput():
    """A speculative failure decoded again plainly is recorded as speculative (retries 1): its plain speed
    must not count as the drafter's."""
    policy = Policy(PolicyConfig(candidates=("none", "ngram@8")))
    retried = selected_record(Choice("ngram", 8), "chat", 11, 1.0).model_copy(update={"retries": 1})
    policy.observe(retried, Choice("ngram", 8))
    assert "chat" not in policy.state["selector"]
    policy.observe(selected_record(Choice("ngram", 8), "chat", 11, 1.0), Choice("ngram", 8))
    assert policy.state["selector"]["chat"]["ngram@8"] == {"requests": 1, "goodput": 10.0}
