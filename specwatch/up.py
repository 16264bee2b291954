"""`specwatch up`: the collector, the engine and sample traffic on the embedded defaults.

Starts the collector (SQLite under --data-dir) as a child process, loads the bundled
model, sends a sample workload through the engine with telemetry going to the
collector, prints each request and the collector's view of the window, then keeps
the collector serving until Ctrl-C (or exits with --once).
"""

from __future__ import annotations

import argparse
import subprocess
import time
from pathlib import Path

import httpx

from specwatch.cli import UsageError, tcp_port


def register(subparsers: argparse._SubParsersAction) -> None:
    up = subparsers.add_parser("up", help="run collector + engine with sample traffic on the embedded defaults")
    up.add_argument("--data-dir", type=Path, default=Path("data"), help="where SQLite and the spool live (default: ./data)")
    up.add_argument("--port", type=tcp_port, default=8087, help="collector port (default: 8087)")
    up.add_argument("--requests", type=int, default=8, help="sample requests to send (default: 8)")
    up.add_argument("--max-tokens", type=int, default=96)
    up.add_argument("--once", action="store_true", help="exit after the sample traffic instead of serving on")
    from engine.cli import add_model_arguments

    add_model_arguments(up)
    up.set_defaults(handler=run_up)


def run_up(args: argparse.Namespace) -> int:
    if args.requests < 0:
        raise UsageError("--requests must be >= 0")
    url = f"http://127.0.0.1:{args.port}"
    collector = start(args.data_dir, args.port)
    try:
        send_sample_traffic(args, url)
        print_window(url)
        if not args.once:
            print(f"\ncollector serving at {url} (data in {args.data_dir}/) - Ctrl-C to stop", flush=True)
            collector.wait()
    finally:
        collector.terminate()
        collector.wait(timeout=30)
    return 0


def start(data_dir: Path, port: int) -> subprocess.Popen:
    from collector.launch import CollectorStartError, start_collector

    log = data_dir / "collector.log"
    try:
        process = start_collector(port, log, env={"SPECWATCH_DATA_DIR": str(data_dir)})
    except CollectorStartError as exc:
        raise UsageError(str(exc)) from None
    print(f"collector ready at http://127.0.0.1:{port} (log: {log})", flush=True)
    return process


def send_sample_traffic(args: argparse.Namespace, url: str) -> None:
    from collector.client import TelemetryClient
    from engine.cli import engine_config, summary_line
    from engine.engine import Engine, GenerateRequest
    from engine.workload import PROMPTS, chat

    engine = Engine(engine_config(args))
    print(f"engine: {engine.target.name} ({engine.target.dtype}), cold start {engine.target.cold_start_s:.1f}s", flush=True)
    client = TelemetryClient(url, spool_dir=args.data_dir / "spool")
    client.submit_event(cold_start_event(engine))
    scenarios = [(kind, drafter) for kind in PROMPTS for drafter in ("ngram", None)]
    try:
        for i in range(args.requests):
            kind, drafter = scenarios[i % len(scenarios)]
            request = GenerateRequest(messages=chat(kind), max_tokens=args.max_tokens, drafter=drafter, tags={"scenario": kind})
            record = engine.generate(request).record
            client.submit_request(record)
            print(f"{kind:<10} {summary_line(record)}", flush=True)
        client.flush(timeout=10)
    finally:
        client.close()


def cold_start_event(engine):
    from collector.schema import EngineEvent

    target = engine.target
    detail = {"model": target.name, "dtype": str(target.dtype).removeprefix("torch."), "from_cache": target.from_cache}
    return EngineEvent(instance=engine.config.instance, at=time.time(), kind="cold_start", detail=detail, duration_s=target.cold_start_s)


def print_window(url: str) -> None:
    signals = httpx.get(f"{url}/v1/signals", params={"last": 3600}, timeout=10).json()

    def fmt(value, scale: float = 1.0, digits: int = 2) -> str:
        return "n/a" if value is None else f"{value * scale:.{digits}f}"

    print(
        f"\ncollector, last hour: {signals.get('requests')} requests, acceptance rate {fmt(signals.get('acceptance_rate'))}, "
        f"mean acceptance length {fmt(signals.get('mean_acceptance_length'))}, "
        f"TTFT P99 {fmt(signals.get('ttft', {}).get('p99'), 1000, 0)} ms"
    )
    alerts = httpx.get(f"{url}/v1/alerts", timeout=10).json()["alerts"]
    print(f"alerts: {len(alerts)} pending or firing" + "".join(
        f"\n  {a['state']:<8} {a['rule']} {a['annotations'].get('summary', '')}" for a in alerts))
