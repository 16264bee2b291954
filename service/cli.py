"""`specwatch collector serve`: the HTTP service (ingest, queries, alerts, cost, reports)."""

from __future__ import annotations

import argparse
import signal
import sys

from specwatch.collector.cli import add_db_option, settings_from
from specwatch.common.auth import ROLES
from specwatch.common.cli import is_loopback, tcp_port
from specwatch.common.errors import UsageError


def register(subparsers: argparse._SubParsersAction) -> None:
    collector = subparsers.add_parser("collector", help="the telemetry collector service")
    collector_commands = collector.add_subparsers(dest="collector_command", required=True, metavar="SUBCOMMAND")
    serve = collector_commands.add_parser("serve", help="run the ingest + query HTTP service")
    add_db_option(serve)
    serve.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=tcp_port, default=8087, help="TCP port (default 8087)")
    serve.add_argument(
        "--insecure",
        action="store_true",
        help="allow a non-loopback --host with no token configured (anyone reaching it can read and write)",
    )
    serve.add_argument(
        "--scrape-vllm",
        metavar="URL",
        nargs="+",
        default=None,
        help="/metrics URLs to poll: vLLM, SGLang, llama.cpp or TensorRT-LLM (/prometheus/metrics), each found by its "
        "metric prefix (default: SPECWATCH_SCRAPE_VLLM)",
    )
    serve.add_argument(
        "--alert-rules",
        metavar="FILE",
        default=None,
        help="alert rules YAML (default: SPECWATCH_ALERT_RULES, else the shipped rules)",
    )
    serve.add_argument("--no-alerts", action="store_true", help="do not run the alert runner in this process")
    serve.set_defaults(handler=serve_command)


def serve_command(args: argparse.Namespace) -> int:
    from specwatch.alerts.rules import RulesError, load_config
    from specwatch.collector.ingest.parse import tune_gc_for_ingest
    from specwatch.common import serving
    from specwatch.service.app import create_app

    settings = settings_from(args)
    check_exposure(args.host, settings.tokens.enabled, args.insecure)
    if settings.alerts_enabled:
        try:
            load_config(settings.alert_rules)
        except RulesError as exc:
            raise UsageError(str(exc)) from None
    check_report_settings(settings)
    app = create_app(settings)
    roles = [role for role in ROLES if settings.tokens.tokens(role)]
    print(f"access control: {'tokens for ' + ', '.join(roles) if roles else 'off, no token configured'}", flush=True)
    tune_gc_for_ingest()
    # uvicorn re-raises a SIGTERM it caught once it has shut down; leave through Python then, so
    # exit handlers run (multiprocessing unlinks the ingest workers' semaphores in one).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    serving.run(app, args.host, args.port, log_level="info")  # uvicorn with a request-header deadline
    return 0


def check_report_settings(settings) -> None:
    """A UsageError, one line, for a bad SPECWATCH_REPORT_HIDDEN_COSTS file (the scheduled report reads it)."""
    if settings.report_hidden_costs is None:
        return
    from specwatch.report.schedule import hidden_costs

    try:
        hidden_costs(settings)
    except ValueError as exc:
        raise UsageError(f"SPECWATCH_REPORT_HIDDEN_COSTS: {exc}") from None


def check_exposure(host: str, tokens_configured: bool, insecure: bool) -> None:
    """A UsageError for a collector reachable from other machines that anyone could read and write."""
    if tokens_configured or insecure or is_loopback(host):
        return
    raise UsageError(
        f"refusing to listen on {host} with no token configured: anyone who can reach it could read and write "
        "telemetry; set SPECWATCH_INGEST_TOKEN and SPECWATCH_READ_TOKEN (or SPECWATCH_TOKENS_FILE), or pass --insecure"
    )
