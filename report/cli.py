"""`specwatch report`: the monthly cost-benefit report as a self-contained HTML file and JSON.

    specwatch report [--month YYYY-MM] [--out DIR] [--db URL] [--gpu TYPE] [--prices FILE]
                     [--pricing P] [--hidden-costs FILE.toml] [--incidents seed|alerts] [--idle-allocation A]

--month defaults to the current month to date (UTC), and says so on stderr: the first report after
`specwatch up` reads what it stored. The files are `specwatch-report-YYYY-MM.html` and `.json`
in DIR (default: the current directory). Prints both paths. --hidden-costs: overrides of the
hidden costs (the keys of [hidden] in cost/cost_example.toml), shown with source "given" in the
report's assumptions table; a bad file exits 2 with one line, before the store is read.
"""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path

from specwatch.collector.cli import add_db_option
from specwatch.common.errors import UsageError
from specwatch.cost.options import add_model_options, add_price_options


def register(subparsers: argparse._SubParsersAction) -> None:
    report = subparsers.add_parser("report", help="write the monthly cost-benefit report (HTML + JSON)")
    report.add_argument(
        "--month", metavar="YYYY-MM", default=None, help="the month to report (default: this month to date, UTC)"
    )
    report.add_argument("--out", metavar="DIR", type=Path, default=Path("."), help="output directory (default: .)")
    add_db_option(report)
    add_price_options(report)
    add_model_options(report)
    report.set_defaults(handler=report_command)


def report_command(args: argparse.Namespace) -> int:
    from specwatch.report.build import month_window, this_month

    month = args.month or this_month()
    try:
        window = month_window(month)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.month is None:
        print(f"specwatch report: {month} to date ({_utc(window.start)} to {_utc(window.end)} UTC); "
              "--month YYYY-MM for another month", file=sys.stderr)  # fmt: skip
    html_path, json_path = _write(args, month)
    print(html_path)
    print(json_path)
    return 0


def _utc(epoch_s: float) -> str:
    return datetime.fromtimestamp(epoch_s, UTC).strftime("%Y-%m-%d %H:%M")


def _write(args: argparse.Namespace, month: str) -> tuple[Path, Path]:
    from sqlalchemy.exc import OperationalError

    from specwatch.collector.cli import settings_from
    from specwatch.collector.db import is_current, make_db
    from specwatch.cost.inputs import load_prices
    from specwatch.cost.options import model_overrides
    from specwatch.report.build import build_report
    from specwatch.report.html import write_report

    try:
        prices = load_prices(args.prices)
        overrides, hidden = model_overrides(args)  # a bad hidden-costs file fails here, before the store is read
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    db = make_db(settings_from(args).database_url_resolved)
    try:
        if not is_current(db):
            raise UsageError("the database schema is not current: run `specwatch db upgrade` first")
        report = build_report(
            db,
            month,
            prices,
            gpu_type=args.gpu,
            hidden=hidden,
            overrides=overrides,
            incidents_from_alerts=args.incidents == "alerts",
        )
        return write_report(report, args.out)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    except OperationalError as exc:
        raise UsageError(f"cannot read the database: {str(exc.orig).splitlines()[0]}") from None
    except OSError as exc:
        raise UsageError(f"cannot write the report to {args.out}: {exc.strerror}") from None
    finally:
        db.dispose()
