"""Command-line helpers: `UsageError` is bad input from the user (printed as one line, exit code 2)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from common.auth import first_token
from common.errors import UsageError  # noqa: F401 (the CLI helpers' error, re-exported)


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
