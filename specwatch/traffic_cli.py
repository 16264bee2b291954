"""`specwatch traffic`: scenario traffic against any OpenAI-compatible server (the engine, the gateway)."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json

import httpx

from specwatch.common.errors import UsageError
from specwatch.traffic import TrafficConfig, print_summary, run_traffic, summary
from specwatch.workload import PROMPTS


def register(subparsers: argparse._SubParsersAction) -> None:
    _register_traffic(subparsers)


def _register_traffic(subparsers: argparse._SubParsersAction) -> None:
    traffic = subparsers.add_parser("traffic", help="send scenario traffic to an engine through its OpenAI API")
    traffic.add_argument(
        "--url", default="http://127.0.0.1:8000", help="engine base URL (default: http://127.0.0.1:8000)"
    )
    traffic.add_argument(
        "--scenarios",
        nargs="+",
        default=["chat", "grounded", "summary", "code-edit", "extraction"],
        help="any of: grounded summary code-edit chat extraction long-context",
    )
    traffic.add_argument("--duration", type=float, default=30.0, help="seconds (default: 30)")
    traffic.add_argument("--requests", type=int, default=1000, help="at most this many requests (default: 1000)")
    traffic.add_argument("--concurrency", type=int, default=4, help="concurrent clients (default: 4)")
    traffic.add_argument(
        "--rate", type=float, default=None, help="Poisson arrivals per second instead of fixed concurrency"
    )
    traffic.add_argument("--max-tokens", type=int, default=64)
    traffic.add_argument("--drafter", default="ngram")
    traffic.add_argument("--json", action="store_true", help="print the summary as JSON")
    traffic.set_defaults(handler=run_traffic_command)


def run_traffic_command(args: argparse.Namespace) -> int:
    unknown = [s for s in args.scenarios if s not in PROMPTS]
    if unknown:
        raise UsageError(f"unknown scenario {unknown[0]!r}; choose from {', '.join(PROMPTS)}")
    if args.duration <= 0 or args.requests < 1 or args.concurrency < 1 or (args.rate is not None and args.rate <= 0):
        raise UsageError("--duration, --rate must be > 0 and --requests, --concurrency >= 1")
    try:
        httpx.get(f"{args.url}/v1/models", timeout=5).raise_for_status()
    except httpx.HTTPError as exc:
        raise UsageError(
            f"no engine answering at {args.url} ({exc}); start one with `specwatch engine serve`"
        ) from None
    drafter = None if args.drafter == "none" else args.drafter
    options = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrafficConfig) if hasattr(args, f.name)}
    overrides = {"scenarios": tuple(args.scenarios), "duration_s": args.duration, "max_requests": args.requests}
    config = TrafficConfig(**{**options, **overrides, "drafter": drafter})
    tally = asyncio.run(run_traffic(config))
    rows = summary(tally)
    print(json.dumps(rows, indent=2)) if args.json else print_summary(rows)
    return 1 if tally.stopped else 0
