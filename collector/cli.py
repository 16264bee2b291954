"""`specwatch collector serve` and `specwatch db upgrade`."""

from __future__ import annotations

import argparse
import signal
import sys

from pydantic import ValidationError
from sqlalchemy.exc import ArgumentError
from sqlalchemy.engine import make_url

from collector.settings import Settings
from specwatch.cli import UsageError, tcp_port


def register(subparsers: argparse._SubParsersAction) -> None:
    collector = subparsers.add_parser("collector", help="the telemetry collector service")
    collector_commands = collector.add_subparsers(dest="collector_command", required=True, metavar="SUBCOMMAND")
    serve = collector_commands.add_parser("serve", help="run the ingest + query HTTP service")
    _add_db_option(serve)
    serve.add_argument("--host", default="127.0.0.1", help="interface to listen on (default 127.0.0.1)")
    serve.add_argument("--port", type=tcp_port, default=8087, help="TCP port (default 8087)")
    serve.add_argument(
        "--scrape-vllm", metavar="URL", nargs="+", default=None,
        help="vLLM /metrics URLs to poll (default: SPECWATCH_SCRAPE_VLLM)",
    )
    serve.add_argument("--alert-rules", metavar="FILE", default=None,
                       help="alert rules YAML (default: SPECWATCH_ALERT_RULES, else the shipped rules)")
    serve.add_argument("--no-alerts", action="store_true", help="do not run the alert runner in this process")
    serve.set_defaults(handler=serve_command)

    db = subparsers.add_parser("db", help="database maintenance")
    db_commands = db.add_subparsers(dest="db_command", required=True, metavar="SUBCOMMAND")
    upgrade = db_commands.add_parser("upgrade", help="apply the schema migrations")
    _add_db_option(upgrade)
    upgrade.set_defaults(handler=upgrade_command)


def _add_db_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db", metavar="URL", default=None,
        help="SQLAlchemy URL (default: SPECWATCH_DATABASE_URL, else SQLite under SPECWATCH_DATA_DIR)",
    )


def settings_from(args: argparse.Namespace) -> Settings:
    """Settings from the environment, with command-line options taking precedence."""
    overrides: dict = {}
    if args.db:
        try:
            make_url(args.db)
        except ArgumentError:
            raise UsageError(f"--db is not a database URL: {args.db!r}") from None
        overrides["database_url"] = args.db
    if getattr(args, "scrape_vllm", None):
        overrides["scrape_vllm"] = args.scrape_vllm
    if getattr(args, "alert_rules", None):
        overrides["alert_rules"] = args.alert_rules
    if getattr(args, "no_alerts", False):
        overrides["alerts_enabled"] = False
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        raise UsageError(settings_error(exc)) from None


def settings_error(exc: ValidationError) -> str:
    """`SPECWATCH_INGEST_PROCESSES: Input should be ... (got 'abc')`, one line per bad setting."""
    return "; ".join(
        f"SPECWATCH_{'_'.join(str(part) for part in error['loc']).upper()}: {error['msg']} (got {error['input']!r})"
        for error in exc.errors(include_url=False)
    )


def serve_command(args: argparse.Namespace) -> int:
    import uvicorn

    from alerts.rules import RulesError, load_config
    from collector.app import create_app
    from collector.ingest import tune_gc_for_ingest

    settings = settings_from(args)
    if settings.alerts_enabled:
        try:
            load_config(settings.alert_rules)
        except RulesError as exc:
            raise UsageError(str(exc)) from None
    app = create_app(settings)
    tune_gc_for_ingest()
    # uvicorn re-raises a SIGTERM it caught once it has shut down; leave through Python then, so
    # exit handlers run (multiprocessing unlinks the ingest workers' semaphores in one).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    uvicorn.run(app, host=args.host, port=args.port, log_level="info")
    return 0


def migrated_engine(settings: Settings):
    """An Engine on the configured database at the newest schema; an unreachable one is a UsageError."""
    from sqlalchemy.exc import OperationalError

    from collector.db import make_engine, upgrade

    engine = make_engine(settings.database_url_resolved)
    try:
        upgrade(engine)
    except OperationalError as exc:
        engine.dispose()
        raise UsageError(f"cannot reach the database: {str(exc.orig).splitlines()[0]}") from None
    return engine


def upgrade_command(args: argparse.Namespace) -> int:
    engine = migrated_engine(settings_from(args))
    engine.dispose()
    print(f"database at the newest schema: {engine.url.render_as_string(hide_password=True)}")
    return 0
