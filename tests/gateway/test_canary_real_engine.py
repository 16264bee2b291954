"""The canary loop end to end on real servers (issue 26 #3): the bundled SmolLM2 as every pool, a real
gateway sending its records to a real collector (`specwatch collector serve`, its leader's alert runner
posting to a real webhook receiver), traffic through the gateway, and `specwatch tune canary` as a child
process at a 50% share (the A/B phase: one upstream per arm, so the arms run at matched load).

- promote: the candidate drafts n-gram on prompts that copy text (the engine's measured 3-6x case)
  against plain decoding; it wins significantly and the gateway's share goes to 1.
- roll back: the candidate is an untrained early exit (4 of 30 layers) drafting a fixed 8 tokens per
  step on open chat, which the profile shows to lose (DESIGN.md: its drafts agree 1-4% of the time);
  it is significantly slower and the share goes to 0.

Both verdicts are `canary_verdict` events, transitions of CanaryVerdict in GET /v1/alerts/history, and
Alertmanager v4 webhooks at the receiver."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
from canary_harness import collector_with_receiver, run_canary, verdict_alerts
from engine_harness import BackgroundServer

from specwatch.engine.lookahead import CostCurve
from specwatch.engine.policy import PolicyConfig
from specwatch.engine.scheduler import SchedulerConfig
from specwatch.workload import COPY, chat

pytestmark = pytest.mark.slow
PER_ARM = 8


@pytest.fixture(scope="module")
def collector(tmp_path_factory):
    with collector_with_receiver(tmp_path_factory.mktemp("canary")) as found:
        yield found


def early_exit_engine(bundled_engine):
    """The bundled engine's weights under a fixed lookahead: every step drafts the request's gamma."""
    fixed = copy.copy(bundled_engine)
    fixed.config, fixed.step_costs = replace(bundled_engine.config, lookahead="fixed"), CostCurve()
    return fixed


@pytest.fixture(scope="module")
def engines(bundled_engine):
    """{name: server}: plain (today's config), ngram (a winning candidate), early-exit (a losing one)."""
    slots = SchedulerConfig(slots=2, max_queue=64)
    always = PolicyConfig(min_acceptance=0.0, load_off=1000, load_on=999)  # keep speculating: the canary judges
    plain = BackgroundServer(bundled_engine, slots, always, default_drafter="none")
    ngram = BackgroundServer(bundled_engine, slots, always, default_drafter="ngram")
    loser = BackgroundServer(early_exit_engine(bundled_engine), slots, always, default_drafter="early-exit:4")
    with plain, ngram, loser:
        yield {"plain": plain, "ngram": ngram, "early-exit:4": loser}


@pytest.fixture(scope="module")
def verdicts(collector, engines, tmp_path_factory):
    url, spool = collector[0], tmp_path_factory.mktemp("spool")
    runs = {
        "promote": ("ngram", "edge-ngram", {"messages": [{"role": "user", "content": COPY}], "max_tokens": 32}),
        "rollback": ("early-exit:4", "edge-early", {"messages": chat("chat"), "max_tokens": 24, "gamma": 8}),
    }
    found = {}
    for decision, (candidate, name, body) in runs.items():
        upstreams = [f"cand={engines[candidate].url},drafter={candidate}", f"today={engines['plain'].url}"]
        found[decision] = run_canary(url, spool / name, upstreams, name, {**body, "temperature": 0}, PER_ARM)
    return found


def test_a_winning_candidate_is_promoted(verdicts):
    detail, progress, share = verdicts["promote"]
    assert detail["decision"] == "promote" and "significantly faster" in detail["reason"], detail
    assert share == 1.0 and detail["share"] == {"from": 0.5, "to": 1.0} and detail["applied"]
    assert detail["p_value"] < 0.05 and detail["speedup"] > 1.0
    assert detail["candidate"]["ms_per_token"] < detail["control"]["ms_per_token"]
    assert min(detail["candidate"]["requests"], detail["control"]["requests"]) >= PER_ARM
    assert detail["candidate"]["upstreams"] == ["cand"] and detail["control"]["upstreams"] == ["today"]
    assert progress.startswith("canary") and f"/{PER_ARM} ok" in progress  # the progress lines


def test_a_losing_candidate_is_rolled_back(verdicts):
    detail, _, share = verdicts["rollback"]
    assert detail["decision"] == "rollback" and "significantly slower" in detail["reason"], detail
    assert share == 0.0 and detail["share"]["to"] == 0.0 and detail["applied"]
    assert detail["speedup"] < 1.0 and detail["p_value"] < 0.05


def test_both_verdicts_are_in_alert_history_and_at_the_webhook_receiver(collector, verdicts):
    transitions, hooked = verdict_alerts(*collector, 2)
    assert sorted(t["labels"]["decision"] for t in transitions) == ["promote", "rollback"]
    by_decision = {a["labels"]["decision"]: a for a in hooked}
    assert by_decision["promote"]["labels"]["instance"] == "edge-ngram"
    assert by_decision["rollback"]["labels"]["instance"] == "edge-early"
    assert "significantly slower" in by_decision["rollback"]["annotations"]["description"]
    assert by_decision["promote"]["annotations"]["share"] == "0.5 -> 1.0"
