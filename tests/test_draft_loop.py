"""Issue 56 #4, the loop closed end to end through the gateway, on real processes: a collector (its leader's
alert runner posting to a real webhook receiver), engines (`specwatch engine serve`), a gateway
(`specwatch gateway serve`), and the CLI as an operator runs it (`draft export`, `draft train`, `draft canary`).

1. A tiny chat target (tests/draft_domains.py) is served with the current drafter, a shallow exit trained
   on domain A ("prose") only; the engine captures the requests whose acceptance falls below 0.5.
2. Traffic through the gateway on domain A, then switched to domain B ("codes"): the current drafter's
   acceptance falls, SpecAcceptanceLow fires on its slice and its webhook names the capture and the export.
3. The export command of the webhook, run as written, and `draft train` on it make the retrained drafter.
4. A second engine serves it; the gateway is restarted with it as the spec pool (the candidate) and the
   current drafter as the plain pool (control); `draft canary` at a 50% share on domain B traffic.
5. The verdict is promote, the retrained arm's acceptance is the higher, and domain B's acceptance through
   the gateway recovers above the alert's threshold after the promotion.

The timeline (seconds from the start) is printed: `pytest -s tests/test_draft_loop.py`.
"""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import draft_domains
import httpx
import pytest
import torch
from waiting import wait_for
from webhook_receiver import Receiver

from specwatch.common.procs import child_env, free_port, specwatch_command, start_collector, start_service, stop_process

pytestmark = pytest.mark.slow
TOKENS = {"SPECWATCH_INGEST_TOKEN": "ing", "SPECWATCH_READ_TOKEN": "rd", "SPECWATCH_ADMIN_TOKEN": "adm",
          "SPECWATCH_CONTROL_TOKEN": "ctl"}  # fmt: skip
THRESHOLD = 0.5
CODES = r"([A-H][0-9]{3}-[XYZ] ?)+"  # a domain B prompt (tests/draft_domains.py)
RULES = f"""
evaluation:
  interval: 1s
rules:
  - name: SpecAcceptanceLow
    signal: acceptance_rate
    op: "<"
    threshold: {THRESHOLD}
    window: 20s
    for: 0s
    min_samples: 6
    group_by: [instance, model, drafter]
    actions: [recommend_draft_retraining]
receivers:
  - name: ops
    url: http://127.0.0.1:{{port}}/hook
    retry_backoff: 0.5s
"""
TRAIN = ["--kind", "head", "--steps", "150", "--batch", "64", "--lr", "0.01", "--held-out", "4"]


class Timeline:
    def __init__(self) -> None:
        self.start, self.steps = time.monotonic(), []

    def mark(self, step: str) -> None:
        self.steps.append((time.monotonic() - self.start, step))

    def __str__(self) -> str:
        return "\n".join(f"{at:7.1f} s  {step}" for at, step in self.steps)


class Stack:
    """The processes of the loop, stopped in reverse order by `stack.close()`."""

    def __init__(self, tmp: Path) -> None:
        self.tmp, self.env, self.exits = tmp, child_env(TOKENS), ExitStack()
        self.receiver = Receiver(free_port())
        self.exits.callback(self.receiver.close)
        (tmp / "rules.yaml").write_text(RULES.format(port=self.receiver.server.server_address[1]))
        port = free_port()
        self.collector = f"http://127.0.0.1:{port}"
        env = {**TOKENS, "SPECWATCH_ALERT_RULES": str(tmp / "rules.yaml"), "SPECWATCH_INGEST_PROCESSES": "0",
               "SPECWATCH_EXTERNAL_URL": self.collector}  # fmt: skip
        self._keep(start_collector(port, tmp / "collector.log", f"sqlite:///{tmp / 'specwatch.db'}", env))

    def _keep(self, process: subprocess.Popen) -> subprocess.Popen:
        self.exits.callback(stop_process, process, 15)
        return process

    def engine(self, name: str, target: Path, draft: Path) -> str:
        """An engine serving `target` with `draft` as its default drafter (`model:<draft dir name>`)."""
        port = free_port()
        cmd = specwatch_command(
            "engine", "serve", "--port", str(port), "--model", str(target), "--dtype", "float32", "--threads", "1",
            "--drafters", f"{draft.name}=model:{draft}", "--default-drafter", draft.name, "--lookahead", "fixed",
            "--min-acceptance", "0", "--load-off", "1000", "--load-on", "999", "--instance", name,
            "--collector", self.collector, "--spool-dir", str(self.tmp / f"spool-{name}"),
            "--capture", "rate=1,below-acceptance=0.5", "--sample-interval", "1",
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        self._keep(start_service(f"engine {name}", cmd, self.env, self.tmp / f"{name}.log", url + "/health", 180))
        return url

    def gateway(self, upstreams: list[str]) -> tuple[subprocess.Popen, str]:
        """The gateway `edge` in front of `upstreams` (its acceptance floor off: the canary judges)."""
        port = free_port()
        cmd = specwatch_command(
            "gateway", "serve", "--port", str(port), "--collector", self.collector, "--name", "edge",
            "--spool-dir", str(self.tmp / f"spool-edge-{port}"), "--min-acceptance", "0", "--load-off", "1000",
            "--load-on", "999", "--health-interval", "0.5", *(a for u in upstreams for a in ("--upstream", u)),
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        return self._keep(
            start_service("gateway", cmd, self.env, self.tmp / f"edge-{port}.log", url + "/health", 60)
        ), url

    def run(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
        done = subprocess.run(
            specwatch_command(*args), capture_output=True, text=True, timeout=timeout, cwd=self.tmp, env=self.env
        )
        assert done.returncode == 0, done.stderr[-2000:]
        return done

    def acceptance(self, start: float, end: float, domain: str, requests: int) -> float:
        """Accepted / drafted tokens of the domain's requests in [start, end), from the collector, once it
        holds `requests` of them (telemetry arrives in batches)."""
        params = {"by": "mode", "start": start, "end": end, "tag": f"scenario:{domain}"}

        def speculative() -> dict:
            found = httpx.get(f"{self.collector}/v1/compare", params=params, headers={"authorization": "Bearer rd"})
            return found.json().get("speculative") or {}

        wait_for(lambda: speculative().get("requests", 0) >= requests, f"{requests} {domain} records", 30, 0.5)
        return speculative()["acceptance_rate"]

    def close(self) -> None:
        self.exits.close()


class Traffic:
    """Client threads sending the domain's chats (a new prompt each, seeds from `first`) through the gateway
    until stopped."""

    def __init__(self, url: str, domain: str, threads: int = 1, first: int = 0) -> None:
        self.url, self.domain, self.stop = url, domain, threading.Event()
        self.answers: list[int] = []
        self.threads = [threading.Thread(target=self._run, args=(first + i,), daemon=True) for i in range(threads)]

    def _run(self, first: int) -> None:
        with httpx.Client(timeout=120) as client:
            for seed in range(first, first + 10**6, len(self.threads)):
                if self.stop.is_set():
                    return
                self.answers.append(
                    client.post(f"{self.url}/v1/chat/completions", json=body(self.domain, seed)).status_code
                )

    def __enter__(self):
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(timeout=120)


def body(domain: str, seed: int) -> dict:
    return {"model": "tiny-chat", "messages": draft_domains.messages(domain, seed), "max_tokens": 48,
            "temperature": 0, "gamma": 4, "tags": {"scenario": domain}}  # fmt: skip


def send(url: str, domain: str, count: int, first: int = 0) -> None:
    with httpx.Client(timeout=120) as client:
        for seed in range(first, first + count):
            assert client.post(f"{url}/v1/chat/completions", json=body(domain, seed)).status_code == 200


def firing(receiver: Receiver, drafter: str) -> list[dict]:
    return [a for b in receiver.bodies() for a in b["alerts"]
            if a["labels"].get("alertname") == "SpecAcceptanceLow" and a["labels"].get("drafter") == drafter
            and a["status"] == "firing"]  # fmt: skip


@pytest.fixture(scope="module")
def loop(tmp_path_factory):
    tmp, timeline = tmp_path_factory.mktemp("loop"), Timeline()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        target, current = draft_domains.build(tmp)
    finally:
        torch.set_num_threads(threads)
    timeline.mark("built the tiny target and the current drafter (an exit trained on domain A only)")
    stack = Stack(tmp)
    try:
        yield run_loop(stack, target, current, timeline)
    finally:
        stack.close()


def run_loop(stack: Stack, target: Path, current: Path, timeline: Timeline) -> dict:
    found = {"timeline": timeline}
    today = stack.engine("today", target, current)
    gateway, url = stack.gateway([f"today={today},drafter=model:current"])
    timeline.mark("collector, engine (current drafter) and gateway up")
    found |= drop_and_alert(stack, url, timeline)
    retrained, found["exported"] = retrain(stack, found["alert"], target, timeline)
    candidate = stack.engine("retrained", target, retrained)
    stop_process(gateway, 15)  # the operator's change: the gateway again, with the candidate as its spec pool
    _, url = stack.gateway(
        [f"cand={candidate},drafter=model:retrained", f"today={today},drafter=model:current,pool=plain"]
    )
    timeline.mark("engine (retrained drafter) up; gateway restarted: spec pool = retrained, plain pool = current")
    found |= canary(stack, url, timeline)
    promoted = time.time()
    send(url, "codes", 12, first=3 * 10**6)  # and others again
    found["recovered"] = stack.acceptance(promoted, time.time() + 1, "codes", 12)
    timeline.mark(f"after the promotion: domain B acceptance through the gateway {found['recovered']:.3f}")
    print(f"\ndraft adaptation loop, timeline:\n{timeline}", flush=True)
    return found


def drop_and_alert(stack: Stack, url: str, timeline: Timeline) -> dict:
    start = time.time()
    send(url, "prose", 12)
    time.sleep(2.5)  # two more alert evaluations on domain A alone
    before = stack.acceptance(start, time.time(), "prose", 12)
    quiet = not firing(stack.receiver, "model:current")
    timeline.mark(f"domain A: 12 requests, acceptance {before:.3f}; no alert")
    switched = time.time()
    with Traffic(url, "codes") as traffic:
        wait_for(lambda: firing(stack.receiver, "model:current"), "SpecAcceptanceLow on model:current", 120, 0.5)
    after = stack.acceptance(switched, time.time() + 1, "codes", len(traffic.answers))
    timeline.mark(f"switched to domain B: acceptance {after:.3f}; SpecAcceptanceLow fired on drafter=model:current")
    return {"before": before, "quiet_on_a": quiet, "after": after, "alert": firing(stack.receiver, "model:current")[0]}


def retrain(stack: Stack, alert: dict, target: Path, timeline: Timeline) -> tuple[Path, list[str]]:
    """The webhook's export command as written (its first word the CLI), then `draft train` on its file:
    (the retrained draft, the exported conversations' user turns)."""
    argv = shlex.split(alert["annotations"]["retrain_export"])
    assert argv[0] == "specwatch"
    exported = stack.run(*argv[1:])
    timeline.mark(f"the alert's export command: {exported.stdout.strip()}")
    data = stack.tmp / argv[argv.index("--out") + 1]
    trained = stack.run("draft", "train", "--data", str(data), "--out", str(stack.tmp / "retrained"),
                        "--model", str(target), *TRAIN)  # fmt: skip
    timeline.mark(f"draft train: {trained.stdout.strip()}")
    users = [json.loads(line)["conversations"][-2]["content"] for line in data.read_text().splitlines()]
    return stack.tmp / "retrained", users


def canary(stack: Stack, url: str, timeline: Timeline) -> dict:
    with Traffic(url, "codes", threads=2, first=10**6) as traffic:  # prompts the retrain never saw
        done = stack.run(
            "draft", "canary", "--gateway", url, "--collector", stack.collector, "--share", "0.5",
            "--min-requests", "8", "--max-minutes", "4", "--poll", "0.5", "--json",
        )  # fmt: skip
    detail = json.loads(done.stdout)
    arms = {
        a: f"{detail[a]['drafters'][0]} acceptance {detail[a]['acceptance_rate']:.3f}" for a in ("control", "candidate")
    }
    timeline.mark(f"draft canary: {detail['decision']}, speed-up {detail['speedup']:.2f}x, {arms}")
    return {"verdict": detail, "canary_answers": set(traffic.answers)}


def test_the_drop_fires_the_alert_on_the_drafter_and_names_the_retrain(loop):
    assert loop["before"] >= THRESHOLD and loop["quiet_on_a"], loop  # domain A: the current drafter is fine
    assert loop["after"] < THRESHOLD, loop
    annotations = loop["alert"]["annotations"]
    assert annotations["capture"] == "drafter=model:current model=tiny-chat"
    assert "--drafter model:current --model tiny-chat --target-model tiny-chat" in annotations["retrain_export"]
    # the engines capture requests below 0.5 acceptance: the export is domain B's traffic, which lost it
    assert len(loop["exported"]) >= 8 and all(re.fullmatch(CODES, user) for user in loop["exported"]), loop["exported"]


def test_the_canary_promotes_the_retrained_drafter(loop):
    verdict = loop["verdict"]
    assert verdict["decision"] == "promote" and verdict["applied"], verdict
    assert verdict["candidate"]["drafters"] == ["model:retrained"] and verdict["control"]["drafters"] == [
        "model:current"
    ]
    assert verdict["candidate"]["acceptance_rate"] > verdict["control"]["acceptance_rate"] + 0.3, verdict
    assert verdict["speedup"] > 1.0 and verdict["p_value"] < 0.05
    assert loop["canary_answers"] == {200}


def test_acceptance_on_the_new_domain_recovers_after_the_promotion(loop):
    assert loop["recovered"] >= THRESHOLD > loop["after"], loop
