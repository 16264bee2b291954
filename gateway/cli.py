"""`specwatch gateway serve`: the OpenAI-compatible proxy in front of vLLM servers or our engine."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specwatch.common.cli import (
    add_capture_arguments,
    add_exposure_arguments,
    add_producer_arguments,
    check_exposure,
    tcp_port,
)
from specwatch.common.errors import UsageError


def register(subparsers: argparse._SubParsersAction) -> None:
    gateway = subparsers.add_parser("gateway", help="OpenAI-compatible proxy with canary A/B in front of vLLM servers")
    commands = gateway.add_subparsers(dest="gateway_command", required=True, metavar="SUBCOMMAND")
    serve = commands.add_parser("serve", help="proxy /v1/chat/completions, /v1/completions and /v1/models")
    serve.add_argument(
        "--upstream",
        action="append",
        default=[],
        required=True,
        metavar="NAME=URL[,drafter=D][,gamma=K][,capacity=N][,pool=spec|plain][,auth=forward]",
        help="an upstream server (repeat); with a drafter (vLLM's method: ngram, suffix, eagle, eagle3, mtp, medusa, "
        "draft_model:NAME) it joins the spec pool, without one the plain pool; capacity: its --max-num-seqs "
        "(default 8), the denominator of its load; auth=forward: it also gets the client's Authorization header "
        "(never sent otherwise)",
    )
    add_exposure_arguments(serve)
    serve.add_argument("--port", type=tcp_port, default=8100)
    serve.add_argument(
        "--name",
        default="gateway",
        help="instance label of requests no upstream took; every record is tagged gateway=NAME, so the cost "
        "model can share an upstream's time among several gateways: give each gateway its own name",
    )
    add_producer_arguments(serve, Path("data/gateway-spool"))
    add_capture_arguments(serve)
    serve.add_argument(
        "--canary", type=float, default=None, help="share of traffic for the spec pool, the rest to plain (A/B arms)"
    )
    serve.add_argument("--load-off", type=float, default=0.75, help="spec pool off above this load (default: 0.75)")
    serve.add_argument("--load-on", type=float, default=0.60, help="...and back on below this (default: 0.60)")
    serve.add_argument("--long-prompt-tokens", type=int, default=2048, help="longer prompts go to the plain pool")
    serve.add_argument("--min-acceptance", type=float, default=0.3, help="acceptance floor of the spec pool")
    serve.add_argument(
        "--tokenizer", type=Path, default=None, help="a tokenizer.json (or HF directory) to count prompt tokens"
    )
    serve.add_argument("--max-body-bytes", type=int, default=4 * 1024 * 1024, help="larger bodies get 413")
    serve.add_argument("--upstream-timeout", type=float, default=600.0, help="longest wait for an upstream's bytes")
    serve.add_argument("--health-interval", type=float, default=1.0, help="seconds between health checks and scrapes")
    serve.set_defaults(handler=run_serve)


def run_serve(args: argparse.Namespace) -> int:
    from specwatch.common import serving
    from specwatch.gateway.app import create_app
    from specwatch.gateway.core import Gateway, GatewaySettings
    from specwatch.gateway.routing import Router, RoutingConfig
    from specwatch.gateway.upstreams import check_upstreams, parse_upstream
    from specwatch.telemetry import spans
    from specwatch.telemetry.capture_client import capture_setup
    from specwatch.telemetry.client import TelemetryClient
    from specwatch.telemetry.sink import TelemetrySink

    check_exposure("gateway", args)
    upstreams = [parse_upstream(text) for text in args.upstream]
    check_upstreams(upstreams)
    settings = _settings(args, GatewaySettings)
    try:
        config = RoutingConfig(
            canary=args.canary,
            load_off=args.load_off,
            load_on=args.load_on,
            long_prompt_tokens=args.long_prompt_tokens,
            min_acceptance=args.min_acceptance,
        )
        client = TelemetryClient(args.collector, args.spool_dir, args.collector_token) if args.collector else None
        capturer, captures = capture_setup(
            args.capture, args.capture_redact, args.capture_hook, args.collector, args.collector_token
        )
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    spans_out = spans.RequestSpans.from_env("specwatch-gateway")
    sink = TelemetrySink(settings.name, client, spans_out, capturer, captures)
    gateway = Gateway(upstreams, Router(config), settings, sink)
    pools = ", ".join(f"{u.name}={u.url} ({u.pool}{', ' + u.drafter if u.drafter else ''})" for u in upstreams)
    print(
        f"gateway: http://{args.host}:{args.port}/v1 -> {pools}; telemetry -> {args.collector or 'off'}, "
        f"spans -> {spans.endpoint() if sink.spans else 'off'}",
        file=sys.stderr,
    )
    try:
        serving.run(create_app(gateway), args.host, args.port, log_level="warning", access_log=False)
    finally:
        if client is not None:
            client.close()
        if captures is not None:
            captures.close()
    return 0


def _settings(args: argparse.Namespace, settings_type):
    if args.max_body_bytes < 1024:
        raise UsageError("--max-body-bytes must be at least 1024")
    if not 0 < args.upstream_timeout <= 86_400 or not 0.05 <= args.health_interval <= 3600:
        raise UsageError("--upstream-timeout must be in (0, 86400] and --health-interval in [0.05, 3600] seconds")
    return settings_type(
        name=args.name,
        max_body_bytes=args.max_body_bytes,
        upstream_timeout_s=args.upstream_timeout,
        health_interval_s=args.health_interval,
        control_token=args.control_token,
        api_key=args.api_key,
        count_tokens=_token_counter(args.tokenizer) if args.tokenizer else None,
    )


def _token_counter(path: Path):
    """A prompt-token counter from a tokenizer.json (the `tokenizers` library transformers uses)."""
    from tokenizers import Tokenizer

    file = path / "tokenizer.json" if path.is_dir() else path
    try:
        tokenizer = Tokenizer.from_file(str(file))
    except Exception as exc:  # tokenizers raises its own Exception type for a missing or bad file
        raise UsageError(f"--tokenizer {path}: cannot load a tokenizer ({exc})") from None
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False).ids)
