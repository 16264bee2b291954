"""`specwatch up`: the whole product on one laptop, on the embedded defaults.

Starts, as child processes: the collector (SQLite under --data-dir, with the alert runner,
whose remediation points at the engine), the engine with the bundled model (telemetry to
the collector, control API behind a generated token), and the dashboard. Then it drives
the engine with background traffic in phases: grounded work that n-gram drafting suits,
then open chat drafted by an untrained early exit (acceptance of a few percent), so
`SpecAcceptanceLow` really fires and clears (the engine's own low-acceptance fallback is
switched off here, so the alert path is what reacts). Ctrl-C or SIGTERM stops everything in order
(traffic, engine, dashboard, then the collector, so it stores the engine's last telemetry) and prints
one line; `--once` sends `--requests` requests, prints what the collector saw, and exits.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from specwatch.common.auth import ROLE_ENV
from specwatch.common.cli import tcp_port
from specwatch.common.errors import UsageError, require_engine
from specwatch.common.procs import (
    StartError,
    child_env,
    specwatch_command,
    start_collector,
    start_service,
    stop_process,
)
from specwatch.up_rules import CALIBRATION_REQUESTS, calibrate, write_rules

# (name, scenarios, drafter, the alert it must fire or None): the traffic phases `up` cycles through
PHASES = (
    ("grounded work, n-gram drafts", ("grounded", "code-edit"), "ngram", None),
    ("open chat, untrained early-exit drafts", ("chat",), "early-exit:2", "SpecAcceptanceLow"),
    ("mixed traffic, the engine picks drafter and gamma per scenario", ("grounded", "chat", "code-edit"), "auto", None),
)
# A phase whose alert has not fired by its end runs on in steps of STRETCH_S, up to STRETCH_MAX x its length:
# a loaded machine serves fewer requests, so the alert's window fills later.
STRETCH_S, STRETCH_MAX = 30.0, 2.0


def register(subparsers: argparse._SubParsersAction) -> None:
    up = subparsers.add_parser("up", help="collector + engine + alerts + dashboard with sample traffic, on one machine")
    up.add_argument("--data-dir", type=Path, default=Path("data"), help="SQLite, spools and logs (default: ./data)")
    up.add_argument("--port", type=tcp_port, default=8087, help="collector port (default: 8087)")
    up.add_argument("--engine-port", type=tcp_port, default=8000, help="engine port (default: 8000)")
    up.add_argument("--dashboard-port", type=tcp_port, default=8501, help="dashboard port (default: 8501)")
    up.add_argument("--no-dashboard", action="store_true", help="do not start the dashboard")
    up.add_argument("--phase-seconds", type=float, default=240.0, help="length of each traffic phase (default: 240)")
    up.add_argument("--concurrency", type=int, default=2, help="concurrent traffic clients (default: 2)")
    up.add_argument("--max-tokens", type=int, default=64, help="tokens per sample request (default: 64)")
    up.add_argument("--once", action="store_true", help="send --requests requests, print the result, stop everything")
    up.add_argument("--requests", type=int, default=8, help="requests sent with --once (default: 8)")
    from specwatch.engine.cli import add_model_arguments

    add_model_arguments(up)
    up.set_defaults(handler=run_up)


@dataclass
class Stack:
    collector: str
    engine: str
    dashboard: str | None
    processes: list[subprocess.Popen]  # the collector first
    started: float = field(default_factory=time.monotonic)
    done: int = 0  # traffic requests answered (ok or not)
    failed: int = 0
    tokens: dict[str, str] = field(default_factory=dict)  # SPECWATCH_<ROLE>_TOKEN: the collector's, made per run

    @property
    def reads(self) -> dict[str, str]:
        """The headers of up's own reads of the collector (its summary lines): the read token."""
        token = self.tokens.get(ROLE_ENV["read"])
        return {"authorization": f"Bearer {token}"} if token else {}

    def stored(self, timeout_s: float) -> int | None:
        """Requests the collector stored since `up` started, waited for (the engine sends telemetry in
        batches) up to `timeout_s` to reach those the traffic sent; None if it does not answer."""
        return stored_requests(self.collector, self.done, time.monotonic() - self.started, self.reads, timeout_s)

    def stop(self) -> str:
        """Each child in start order after the collector (engine, dashboard), each waited for, then the
        collector, last, so it stores the engine's final telemetry; returns the one-line summary."""
        stored = cancelled = None
        if self.processes:
            for process in self.processes[1:]:
                stop_process(process)
            stored = self.stored(timeout_s=5.0)
            cancelled = cancelled_requests(self.collector, time.monotonic() - self.started, self.reads)
            stop_process(self.processes[0])
        minutes = (time.monotonic() - self.started) / 60
        line = (
            f"specwatch up: stopped after {minutes:.1f} min; {self.done} requests done ({self.failed} failed), "
            f"{'n/a' if stored is None else stored} stored by the collector"
        )
        return line + (f" ({cancelled} of them cancelled in flight by the stop)" if cancelled else "")


def run_up(args: argparse.Namespace) -> int:
    require_engine("up")
    if args.requests < 1 or args.concurrency < 1 or args.phase_seconds <= 0 or args.max_tokens < 1:
        raise UsageError("--requests, --concurrency, --max-tokens must be >= 1 and --phase-seconds > 0")
    args.data_dir.mkdir(parents=True, exist_ok=True)
    stack = Stack(f"http://127.0.0.1:{args.port}", f"http://127.0.0.1:{args.engine_port}", None, [])
    previous = signal.signal(signal.SIGTERM, _sigterm_as_ctrl_c)
    unraisable, sys.unraisablehook = sys.unraisablehook, _ctrl_c_in_a_finalizer(sys.unraisablehook)
    give_back_terminal = lead_the_terminal()
    code = 0
    try:
        start_stack(args, stack)
        if args.once:
            asyncio.run(send_traffic(args, stack, PHASES[0], max_requests=args.requests))
            stack.stored(timeout_s=30.0)
            print_window(stack.collector, headers=stack.reads)
        else:
            code = run_phases(args, stack)
    except KeyboardInterrupt:
        print("\nstopping: traffic, engine, dashboard, then the collector ...", flush=True)
    except httpx.HTTPError as exc:
        print(f"specwatch up: the collector did not answer ({exc}); see {args.data_dir}/collector.log", flush=True)
        code = 1
    finally:
        handlers = signal.signal(signal.SIGINT, signal.SIG_IGN), signal.signal(signal.SIGTERM, signal.SIG_IGN)
        print(stack.stop(), flush=True)  # a second Ctrl-C does not cut the ordered stop short
        signal.signal(signal.SIGINT, handlers[0])
        signal.signal(signal.SIGTERM, previous)
        sys.unraisablehook = unraisable
        give_back_terminal()
    return code


def _ctrl_c_in_a_finalizer(hook: Callable) -> Callable:
    """A Ctrl-C (or SIGTERM) can land while Python runs a finalizer (a socket's or generator's cleanup
    collected mid-request); Python then prints 'Exception ignored ... KeyboardInterrupt' and drops it, and
    `up` would run on. This hook delivers it again, as SIGTERM (which `up` reads as Ctrl-C, even when
    started with SIGINT ignored), from a thread a moment later: a handler run inside the hook would raise
    into the hook, and be dropped again. Other unraisable errors go to `hook`."""

    def on_unraisable(unraisable) -> None:
        if issubclass(unraisable.exc_type, KeyboardInterrupt):
            threading.Timer(0.05, os.kill, (os.getpid(), signal.SIGTERM)).start()
        else:
            hook(unraisable)

    return on_unraisable


def lead_the_terminal() -> Callable[[], None]:
    """Under a parent in the terminal's foreground (`make up`), move `up` into its own process group and
    make that the foreground one, as a shell does for a job: Ctrl-C then reaches `up` alone, which stops
    everything and exits 0, and make reports that 0 instead of dying of the signal itself. Returns what
    gives the terminal back to the parent's group (nothing to do when `up` already leads its group)."""
    try:
        fd, parent_group = sys.stdin.fileno(), os.getpgrp()
        if not os.isatty(fd) or parent_group == os.getpid() or os.tcgetpgrp(fd) != parent_group:
            return lambda: None
        os.setpgid(0, 0)
        _set_foreground(fd, os.getpgrp())
    except (OSError, ValueError):  # no terminal, or one we may not take: Ctrl-C goes where it went
        return lambda: None
    return lambda: _set_foreground(fd, parent_group)


def _set_foreground(fd: int, group: int) -> None:
    """tcsetpgrp from a group that may be in the background: SIGTTOU (which would stop us) ignored meanwhile."""
    held = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
    try:
        os.tcsetpgrp(fd, group)
    except OSError:
        pass  # the terminal has gone (hung up): nothing to give back
    finally:
        signal.signal(signal.SIGTTOU, held)


def _sigterm_as_ctrl_c(signum, frame) -> None:
    """SIGTERM does what Ctrl-C does: inside asyncio.run that cancels the traffic, elsewhere it raises
    KeyboardInterrupt."""
    on_ctrl_c = signal.getsignal(signal.SIGINT)
    if not callable(on_ctrl_c):  # started with SIGINT ignored (in the background)
        raise KeyboardInterrupt
    on_ctrl_c(signal.SIGINT, frame)


def start_stack(args: argparse.Namespace, stack: Stack) -> None:
    """Collector, engine, dashboard; a child that cannot start is a UsageError naming its log."""
    try:
        _start_children(args, stack)
    except StartError as exc:
        raise UsageError(str(exc)) from None


def _start_children(args: argparse.Namespace, stack: Stack) -> None:
    """The engine first (its telemetry waits in its spool), so `up` can measure this machine before it
    writes the collector's rules; then the collector (first in `stack.processes`), then the dashboard."""
    token = secrets.token_urlsafe(24)
    # The collector's tokens, new each run; tokens pass in environments, never on command lines (ps shows those).
    stack.tokens = {ROLE_ENV[role]: secrets.token_urlsafe(24) for role in ("ingest", "read", "admin")}
    stack.processes.append(start_engine(args, stack, token))
    print(f"engine     {stack.engine}/v1   (OpenAI-compatible; log {args.data_dir}/engine.log)", flush=True)
    print("engine     measuring this machine's prefill and decode: a few plain requests ...", flush=True)
    speed = asyncio.run(calibrate(stack.engine, tuple({s for phase in PHASES for s in phase[1]})))
    stack.done, stack.failed = CALIBRATION_REQUESTS, CALIBRATION_REQUESTS - speed.requests
    rules, said = write_rules(args.data_dir, stack.engine, args.device == "cpu", speed, args.concurrency)
    print("\n".join(said), flush=True)
    env = {
        **stack.tokens,
        "SPECWATCH_DATA_DIR": str(args.data_dir),
        "SPECWATCH_CONTROL_TOKEN": token,
        "SPECWATCH_ALERT_RULES": str(rules),
        "SPECWATCH_EXTERNAL_URL": stack.collector,
    }
    stack.processes.insert(0, start_collector(args.port, args.data_dir / "collector.log", env=env))
    print(f"collector  {stack.collector}   (alerts every 15 s; log {args.data_dir}/collector.log)", flush=True)
    if not args.no_dashboard:
        from specwatch.dashboard.launch import start_dashboard

        readers = {ROLE_ENV[role]: stack.tokens[ROLE_ENV[role]] for role in ("read", "admin")}
        dashboard = start_dashboard(
            args.dashboard_port, stack.collector, args.data_dir / "dashboard.log", tokens=readers
        )
        stack.processes.append(dashboard)
        stack.dashboard = f"http://127.0.0.1:{args.dashboard_port}"
        print(f"dashboard  {stack.dashboard}", flush=True)


def start_engine(args: argparse.Namespace, stack: Stack, token: str, timeout_s: float = 600.0) -> subprocess.Popen:
    """`specwatch engine serve` with telemetry to the collector; returns once /v1/models answers."""
    cmd = specwatch_command("engine", "serve", "--port", str(args.engine_port), "--collector", stack.collector)
    cmd += ["--spool-dir", str(args.data_dir / "engine-spool"), "--sample-interval", "2"]
    cmd += ["--shutdown-timeout", "10"]  # up stops the traffic first: little is in flight when the engine stops
    cmd += ["--min-acceptance", "0"]  # the engine's own low-acceptance fallback off: in this demo the alert reacts
    cmd += ["--canary-fraction", "0.8"]  # 20% plain 'control' arm: the speed-up is measured A/B, not assumed
    cmd += ["--model", args.model, "--dtype", args.dtype, "--device", args.device, "--threads", str(args.threads)]
    cmd += ["--batch-threads", str(args.batch_threads)]
    print("engine     loading the model (the first run converts the bundled GGUF, ~30 s) ...", flush=True)
    # tokens travel in the environment (the defaults of --collector-token and --control-token), not in `ps`
    env = child_env({ROLE_ENV["ingest"]: stack.tokens.get(ROLE_ENV["ingest"], ""), "SPECWATCH_CONTROL_TOKEN": token})
    return start_service("engine", cmd, env, args.data_dir / "engine.log", f"{stack.engine}/v1/models", timeout_s)


async def send_traffic(
    args: argparse.Namespace, stack: Stack, phase: tuple, duration_s: float = 3600.0, max_requests: int = 1_000_000
) -> None:
    """One phase of traffic, counted in `stack` even if cancelled (Ctrl-C)."""
    from specwatch.traffic import Tally, TrafficConfig, run_traffic

    name, scenarios, drafter, _ = phase
    config = TrafficConfig(
        url=stack.engine,
        scenarios=scenarios,
        duration_s=duration_s,
        max_requests=max_requests,
        concurrency=args.concurrency,
        max_tokens=args.max_tokens,
        drafter=drafter,
    )
    tally = Tally()
    try:
        with (args.data_dir / "traffic.log").open("a") as log:
            await run_traffic(config, progress=log, tally=tally)
    finally:
        failed = sum(not o.ok for o in tally.outcomes)
        stack.done, stack.failed = stack.done + len(tally.outcomes), stack.failed + failed
    print(f"traffic    {name}: {len(tally.outcomes) - failed} requests done, {failed} failed", flush=True)
    if tally.stopped:
        print(f"traffic    {tally.stopped}", flush=True)


def run_phases(args: argparse.Namespace, stack: Stack) -> int:
    """Phase after phase until Ctrl-C; 1 once a child has exited on its own."""
    # a shell without job control starts background commands with SIGINT ignored, and Python keeps it so
    ignored = signal.getsignal(signal.SIGINT) is signal.SIG_IGN
    stop = f"SIGTERM (kill {os.getpid()}) stops everything" if ignored else "Ctrl-C stops everything"
    print(f"\ntraffic phases of {args.phase_seconds:.0f} s each; watch the dashboard. {stop}.", flush=True)
    while True:
        for phase in PHASES:
            print(f"traffic    phase: {phase[0]} ...", flush=True)
            run_phase(args, stack, phase)
            if exited := next((p for p in stack.processes if p.poll() is not None), None):
                name = ("collector", "engine", "dashboard")[stack.processes.index(exited)]
                print(f"specwatch up: the {name} exited (code {exited.returncode}); see {args.data_dir}/{name}.log")
                return 1
            print_window(stack.collector, last_s=args.phase_seconds, headers=stack.reads)


def run_phase(args: argparse.Namespace, stack: Stack, phase: tuple) -> None:
    """One phase of traffic; one with an alert runs on until that alert fires for the phase's drafter (or
    the stretch is spent)."""
    started = time.monotonic()
    asyncio.run(send_traffic(args, stack, phase, duration_s=args.phase_seconds))
    if (alert := phase[3]) is None:
        return
    deadline = started + (1 + STRETCH_MAX) * args.phase_seconds
    if not firing(stack, alert, phase[2]):
        print(f"traffic    {alert} is not firing yet: the phase runs on until it does", flush=True)
    while not (fired := firing(stack, alert, phase[2])) and time.monotonic() < deadline:
        asyncio.run(send_traffic(args, stack, phase, duration_s=STRETCH_S))
    minutes = (time.monotonic() - started) / 60
    said = f"firing, {minutes:.1f} min into the phase" if fired else f"did not fire in {minutes:.1f} min"
    print(f"alerts     {alert} ({phase[2]}) {said}", flush=True)


def firing(stack: Stack, rule: str, drafter: str) -> bool:
    """Whether the collector has an alert of `rule` firing now for `drafter`."""
    try:
        alerts = httpx.get(f"{stack.collector}/v1/alerts", headers=stack.reads, timeout=10).json()["alerts"]
    except (httpx.HTTPError, ValueError, KeyError):
        return False
    return any(a["rule"] == rule and a["state"] == "firing" and a["labels"].get("drafter") == drafter for a in alerts)


def stored_requests(collector: str, expected: int, last_s: float, headers: dict, timeout_s: float = 5.0) -> int | None:
    """Requests the collector stored in the last `last_s` seconds, waited for up to `timeout_s` to reach
    `expected`; None if it does not answer."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            found = httpx.get(f"{collector}/v1/signals", params={"last": last_s + 60}, headers=headers, timeout=5)
            stored = found.json()["requests"]
        except (httpx.HTTPError, ValueError, KeyError):
            return None
        if stored >= expected or time.monotonic() >= deadline:
            return stored
        time.sleep(0.2)


def cancelled_requests(collector: str, last_s: float, headers: dict) -> int | None:
    """Requests the collector stored as cancelled in the last `last_s` seconds (those the stop cut short)."""
    params = {"last": last_s + 60, "status": "cancelled", "limit": 500}
    try:
        return len(httpx.get(f"{collector}/v1/requests", params=params, headers=headers, timeout=5).json()["rows"])
    except (httpx.HTTPError, ValueError, KeyError):
        return None


def print_window(url: str, last_s: float = 3600, headers: dict | None = None) -> None:
    signals = httpx.get(f"{url}/v1/signals", params={"last": last_s}, headers=headers, timeout=10).json()

    def fmt(value, scale: float = 1.0, digits: int = 2) -> str:
        return "n/a" if value is None else f"{value * scale:.{digits}f}"

    print(
        f"collector, last {last_s / 60:.0f} min: {signals['requests']} requests, "
        f"acceptance rate {fmt(signals['acceptance_rate'])}, "
        f"mean acceptance length {fmt(signals['mean_acceptance_length'])}, "
        f"TTFT P99 {fmt(signals['ttft']['p99'], 1000, 0)} ms",
        flush=True,
    )
    alerts = httpx.get(f"{url}/v1/alerts", headers=headers, timeout=10).json()["alerts"]
    print(
        f"alerts: {len(alerts)} pending or firing"
        + "".join(f"\n  {a['state']:<8} {a['rule']}: {a['annotations'].get('summary', '')}" for a in alerts),
        flush=True,
    )
