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
import json
import subprocess
import threading
from dataclasses import replace
from pathlib import Path

import httpx
import pytest
from engine_harness import BackgroundServer
from gateway_harness import GatewayServer
from waiting import wait_for
from webhook_receiver import Receiver

from common.procs import free_port, specwatch_command, start_collector, stop_process
from engine.lookahead import CostCurve
from engine.policy import PolicyConfig
from engine.scheduler import SchedulerConfig
from specwatch.workload import COPY, chat
from telemetry.client import TelemetryClient

pytestmark = pytest.mark.slow
TOKEN = "gw-token"
PER_ARM = 8
RULES = """
evaluation:
  interval: 1s
rules: []
receivers:
  - name: ops
    url: http://127.0.0.1:{port}/hook
    retry_backoff: 0.5s
"""


@pytest.fixture(scope="module")
def collector(tmp_path_factory):
    """(collector URL, webhook receiver): the collector's alert rules post to the receiver."""
    tmp = tmp_path_factory.mktemp("canary")
    receiver = Receiver(free_port())
    (tmp / "rules.yaml").write_text(RULES.format(port=receiver.server.server_address[1]))
    port = free_port()
    env = {"SPECWATCH_ALERT_RULES": str(tmp / "rules.yaml"), "SPECWATCH_INGEST_PROCESSES": "0"}
    process = start_collector(port, tmp / "collector.log", f"sqlite:///{tmp / 'specwatch.db'}", env)
    try:
        yield f"http://127.0.0.1:{port}", receiver, tmp
    finally:
        stop_process(process, timeout_s=15)
        receiver.close()


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


class Traffic:
    """Two client threads sending `messages` through the gateway until stopped."""

    def __init__(self, url: str, messages: list[dict], extra: dict) -> None:
        self.url, self.body, self.stop = url, {"messages": messages, "temperature": 0, **extra}, threading.Event()
        self.answers: list[int] = []
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(2)]

    def _run(self) -> None:
        with httpx.Client(timeout=300) as client:
            while not self.stop.is_set():
                self.answers.append(client.post(f"{self.url}/v1/chat/completions", json=self.body).status_code)

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=300)


def run_canary(collector_url: str, tmp: Path, engines, candidate: str, messages, extra) -> tuple[dict, str, float]:
    """One canary run behind a fresh gateway: (the verdict's detail, the CLI's stderr, the final share)."""
    client = TelemetryClient(collector_url, tmp / f"spool-{candidate}")
    upstreams = [f"cand={engines[candidate].url},drafter={candidate}", f"today={engines['plain'].url}"]
    try:
        with GatewayServer(upstreams, telemetry=client, control_token=TOKEN, name=f"edge-{candidate[:5]}") as gw:
            with Traffic(gw.url, messages, extra) as traffic:
                cmd = specwatch_command(
                    "tune", "canary", "--gateway", gw.url, "--control-token", TOKEN, "--collector", collector_url,
                    "--share", "0.5", "--min-requests", str(PER_ARM), "--max-minutes", "6", "--poll", "0.5", "--json",
                )  # fmt: skip
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=480)
            assert done.returncode == 0, done.stderr
            assert set(traffic.answers) == {200}
            share = httpx.get(f"{gw.url}/v1/control/state", headers={"authorization": f"Bearer {TOKEN}"}).json()
    finally:
        client.close()
    detail = json.loads(done.stdout)
    figures = {k: detail[k] for k in ("decision", "speedup", "p_value")} | {
        arm: {k: detail[arm][k] for k in ("requests", "ms_per_token", "load")} for arm in ("candidate", "control")
    }
    print(f"canary {candidate} vs plain:", figures)
    return detail, done.stderr, share["canary"]


@pytest.fixture(scope="module")
def verdicts(collector, engines):
    url, _, tmp = collector
    promoted = run_canary(url, tmp, engines, "ngram", [{"role": "user", "content": COPY}], {"max_tokens": 32})
    rolled_back = run_canary(url, tmp, engines, "early-exit:4", chat("chat"), {"max_tokens": 24, "gamma": 8})
    return {"promote": promoted, "rollback": rolled_back}


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
    url, receiver, _ = collector

    def history() -> list[dict]:
        found = httpx.get(f"{url}/v1/alerts/history", params={"last": 3600}).json()
        return [t for t in found["transitions"] if t["rule"] == "CanaryVerdict"]

    wait_for(lambda: len(history()) == 2, "two CanaryVerdict transitions", timeout=30, interval=0.5)
    assert sorted(t["labels"]["decision"] for t in history()) == ["promote", "rollback"]

    def hooked() -> list[dict]:
        return [a for b in receiver.bodies() for a in b["alerts"] if b["groupLabels"]["alertname"] == "CanaryVerdict"]

    wait_for(lambda: len(hooked()) == 2, "two CanaryVerdict webhooks", timeout=30, interval=0.5)
    by_decision = {a["labels"]["decision"]: a for a in hooked()}
    assert by_decision["promote"]["labels"]["instance"] == "edge-ngram"
    assert by_decision["rollback"]["labels"]["instance"] == "edge-early"
    assert "significantly slower" in by_decision["rollback"]["annotations"]["description"]
    assert by_decision["promote"]["annotations"]["share"] == "0.5 -> 1.0"
