"""`specwatch db upgrade`, and the settings every command that opens the store shares:
`settings_from(args)` (environment + `--db`) and `migrated_db(settings)`."""

from __future__ import annotations

import argparse

from pydantic import ValidationError
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from specwatch.collector.settings import Settings
from specwatch.common.errors import UsageError


def register(subparsers: argparse._SubParsersAction) -> None:
    db = subparsers.add_parser("db", help="database maintenance")
    db_commands = db.add_subparsers(dest="db_command", required=True, metavar="SUBCOMMAND")
    upgrade = db_commands.add_parser("upgrade", help="apply the schema migrations")
    add_db_option(upgrade)
    upgrade.set_defaults(handler=upgrade_command)


def add_db_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--db",
        metavar="URL",
        default=None,
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


def migrated_db(settings: Settings):
    """An Engine on the configured database at the newest schema; an unreachable one is a UsageError."""
    from sqlalchemy.exc import OperationalError

    from specwatch.collector.db import make_db, upgrade

    db = make_db(settings.database_url_resolved)
    try:
        upgrade(db)
    except OperationalError as exc:
        db.dispose()
        raise UsageError(f"cannot reach the database: {str(exc.orig).splitlines()[0]}") from None
    return db


def upgrade_command(args: argparse.Namespace) -> int:
    db = migrated_db(settings_from(args))
    db.dispose()
    print(f"database at the newest schema: {db.url.render_as_string(hide_password=True)}")
    return 0
