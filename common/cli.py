"""Command-line helpers: `UsageError` is bad input from the user (printed as one line, exit code 2)."""

from __future__ import annotations

import argparse
import ipaddress
import os
import sys
from pathlib import Path

from specwatch.common.auth import first_token, listed_tokens
from specwatch.common.errors import UsageError  # noqa: F401 (the CLI helpers' error, re-exported)


def tcp_port(value: str) -> int:
    """argparse type for --port options."""
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise argparse.ArgumentTypeError(f"not a TCP port: {value!r}")
    return int(value)


def add_producer_arguments(parser: argparse.ArgumentParser, spool_dir: Path) -> None:
    """--collector, --collector-token, --spool-dir and --control-token of a server that produces
    telemetry and takes remediation (the engine, the gateway)."""
    parser.add_argument(
        "--collector",
        default=os.environ.get("SPECWATCH_COLLECTOR_URL"),
        help="collector URL for telemetry (default: SPECWATCH_COLLECTOR_URL; none: no telemetry)",
    )
    parser.add_argument(
        "--collector-token",
        default=first_token(os.environ.get("SPECWATCH_INGEST_TOKEN")),
        help="bearer token for the collector's ingest (default: SPECWATCH_INGEST_TOKEN; refused: spooled, not lost)",
    )
    parser.add_argument(
        "--spool-dir", type=Path, default=spool_dir, help=f"telemetry spool while the collector is down ({spool_dir})"
    )
    parser.add_argument(
        "--control-token",
        default=os.environ.get("SPECWATCH_CONTROL_TOKEN"),
        help="bearer token for /v1/control (default: SPECWATCH_CONTROL_TOKEN; unset: the control API is off)",
    )


def add_capture_arguments(parser: argparse.ArgumentParser) -> None:
    """--capture, --capture-redact and --capture-hook of a producer (telemetry.capture; off by default)."""
    parser.add_argument(
        "--capture",
        default=None,
        metavar="rate=R[,tenant=T][,tag=K:V][,below-acceptance=A][,prompt-tokens=LO-HI][,max-chars=N]"
        "[,max-total-chars=N][,retention-days=D]",
        help="keep a sample of prompts and outputs at the collector, to retrain a draft (docs/security.md, "
        "'Captures'); off unless given; needs --collector",
    )
    parser.add_argument(
        "--capture-redact",
        action="append",
        default=[],
        metavar="REGEX",
        help="replace this regex's matches by [redacted] before a capture leaves the process (repeatable)",
    )
    parser.add_argument(
        "--capture-hook",
        default=None,
        metavar="MODULE:FUNCTION",
        help="a str -> str redaction function run after the regexes; if it raises, nothing is kept",
    )


API_KEY_ENV = "SPECWATCH_API_KEY"


def add_exposure_arguments(parser: argparse.ArgumentParser) -> None:
    """--host, --api-key and --insecure-public of a server with OpenAI routes (the engine, the gateway)."""
    parser.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
    parser.add_argument(
        "--api-key",
        default=os.environ.get(API_KEY_ENV),
        help=f"bearer key(s), comma-separated, the /v1 routes require (default: {API_KEY_ENV}; unset: none, "
        "which only a loopback --host allows)",
    )
    parser.add_argument(
        "--insecure-public",
        action="store_true",
        help="allow a non-loopback --host with no API key (anyone reaching it can send requests)",
    )


def check_exposure(server: str, args: argparse.Namespace) -> None:
    """A UsageError for a server reachable from other machines whose OpenAI routes anyone could call,
    unless --insecure-public says so (then one warning on stderr). Call it before loading anything."""
    if args.api_key and not listed_tokens(args.api_key):
        raise UsageError("--api-key (or SPECWATCH_API_KEY) is set but names no key")
    if args.api_key or is_loopback(args.host):
        return
    if not args.insecure_public:
        raise UsageError(
            f"refusing to listen on {args.host} with no API key: anyone who can reach it could send requests; "
            f"set --api-key (or {API_KEY_ENV}), listen on 127.0.0.1, or pass --insecure-public"
        )
    print(f"warning: the {server} listens on {args.host} with no API key (--insecure-public)", file=sys.stderr)


def is_loopback(host: str) -> bool:
    """True for `localhost` and loopback addresses; any other host name may resolve to any interface."""
    try:
        return host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False
