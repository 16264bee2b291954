"""Shared by the canary's real-server tests: a collector whose alert runner posts to a webhook receiver,
client threads sending traffic through a gateway, and one `specwatch tune canary` run behind a fresh
gateway (a child process, as an operator runs it)."""

from __future__ import annotations

import json
import subprocess
import threading
from contextlib import contextmanager
from pathlib import Path

import httpx
from gateway_harness import GatewayServer
from waiting import wait_for
from webhook_receiver import Receiver

from specwatch.common.procs import free_port, specwatch_command, start_collector, stop_process
from specwatch.telemetry.client import TelemetryClient

TOKEN = "gw-token"
RULES = """
evaluation:
  interval: 1s
rules: []
receivers:
  - name: ops
    url: http://127.0.0.1:{port}/hook
    retry_backoff: 0.5s
"""


@contextmanager
def collector_with_receiver(tmp: Path):
    """(collector URL, webhook receiver): the collector's alert rules post to the receiver."""
    receiver = Receiver(free_port())
    (tmp / "rules.yaml").write_text(RULES.format(port=receiver.server.server_address[1]))
    port = free_port()
    env = {"SPECWATCH_ALERT_RULES": str(tmp / "rules.yaml"), "SPECWATCH_INGEST_PROCESSES": "0"}
    process = start_collector(port, tmp / "collector.log", f"sqlite:///{tmp / 'specwatch.db'}", env)
    try:
        yield f"http://127.0.0.1:{port}", receiver
    finally:
        stop_process(process, timeout_s=15)
        receiver.close()


class Traffic:
    """Two client threads sending one chat body through the gateway until stopped."""

    def __init__(self, url: str, body: dict) -> None:
        self.url, self.body, self.stop = url, body, threading.Event()
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


def run_canary(collector_url: str, spool: Path, upstreams: list[str], name: str, body: dict, per_arm: int):
    """One canary run at a 50% share behind a fresh gateway named `name` (candidate: its spec pool):
    (the verdict's detail, the CLI's stderr, the gateway's share afterwards)."""
    client = TelemetryClient(collector_url, spool)
    try:
        with GatewayServer(upstreams, client=client, control_token=TOKEN, name=name) as gw:
            done, answers = _canary_under_traffic(gw.url, collector_url, body, per_arm)
            state = httpx.get(f"{gw.url}/v1/control/state", headers={"authorization": f"Bearer {TOKEN}"}).json()
    finally:
        client.close()
    assert done.returncode == 0, done.stderr
    assert set(answers) == {200}, answers
    detail = json.loads(done.stdout)
    figures = {k: detail[k] for k in ("decision", "speedup", "p_value")} | {
        arm: {k: detail[arm][k] for k in ("requests", "ms_per_token", "load")} for arm in ("candidate", "control")
    }
    print(f"canary at {name}:", figures)
    return detail, done.stderr, state["canary"]


def _canary_under_traffic(gateway_url: str, collector_url: str, body: dict, per_arm: int):
    with Traffic(gateway_url, body) as traffic:
        cmd = specwatch_command(
            "tune", "canary", "--gateway", gateway_url, "--control-token", TOKEN, "--collector", collector_url,
            "--share", "0.5", "--min-requests", str(per_arm), "--max-minutes", "6", "--poll", "0.5", "--json",
        )  # fmt: skip
        return subprocess.run(cmd, capture_output=True, text=True, timeout=480), traffic.answers


def verdict_alerts(collector_url: str, receiver: Receiver, count: int) -> tuple[list[dict], list[dict]]:
    """CanaryVerdict's transitions in GET /v1/alerts/history and the alerts the receiver got, once both
    hold `count`."""

    def history() -> list[dict]:
        found = httpx.get(f"{collector_url}/v1/alerts/history", params={"last": 3600}).json()
        return [t for t in found["transitions"] if t["rule"] == "CanaryVerdict"]

    def hooked() -> list[dict]:
        return [a for b in receiver.bodies() for a in b["alerts"] if b["groupLabels"]["alertname"] == "CanaryVerdict"]

    wait_for(lambda: len(history()) >= count, f"{count} CanaryVerdict transitions", timeout=30, interval=0.5)
    wait_for(lambda: len(hooked()) >= count, f"{count} CanaryVerdict webhooks", timeout=30, interval=0.5)
    return history(), hooked()
