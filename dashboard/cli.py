"""`specwatch dashboard`: the Streamlit app over a collector."""

from __future__ import annotations

import argparse
import os
import subprocess

from specwatch.common.cli import tcp_port


def register(subparsers: argparse._SubParsersAction) -> None:
    dashboard = subparsers.add_parser("dashboard", help="the Streamlit dashboard over a collector")
    dashboard.add_argument(
        "--collector", default=None, help="collector URL (default: SPECWATCH_COLLECTOR_URL or http://127.0.0.1:8087)"
    )
    dashboard.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
    dashboard.add_argument("--port", type=tcp_port, default=8501, help="TCP port (default 8501)")
    dashboard.set_defaults(handler=run_dashboard)


def run_dashboard(args: argparse.Namespace) -> int:
    from specwatch.dashboard.api import collector_url
    from specwatch.dashboard.launch import command

    env = {**os.environ, "SPECWATCH_COLLECTOR_URL": args.collector or collector_url()}
    print(f"dashboard on http://{args.host}:{args.port} reading {env['SPECWATCH_COLLECTOR_URL']}", flush=True)
    return subprocess.call(command(args.port, args.host), env=env)
