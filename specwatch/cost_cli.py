"""`specwatch cost`: the TCO of speculative decoding for a window of the store, or for what-if inputs.

specwatch cost [--db URL] [--last SECONDS]           measured (default: the last 30 days)
specwatch cost --what-if FILE.toml                   inputs from TOML (cost/cost_example.toml)
    [--gpu TYPE] [--prices FILE] [--pricing on-demand|spot|reserved|on-prem] [--volume TOKENS]
    [--hidden-costs FILE.toml] [--incidents seed|alerts] [--idle-allocation separate|by_share]
    [--json] [--xlsx FILE]

It lives in the CLI package because `--incidents alerts` reads the alert history (`alerts.store`),
which the cost model, sitting below alerts, never imports: the history is read here and handed in.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from specwatch.alerts.store import incident_history
from specwatch.collector.cli import add_db_option
from specwatch.collector.reads.queries import Filters, Window
from specwatch.common.errors import UsageError
from specwatch.cost.inputs import Overrides, apply_overrides, load_hidden_costs, load_prices, what_if_inputs
from specwatch.cost.model import HiddenCosts
from specwatch.cost.options import add_model_options, add_price_options, model_overrides, positive
from specwatch.cost.summary import MONTH_S, CostSummary, measured_summary, render_text, summarize


def register(subparsers: argparse._SubParsersAction) -> None:
    cost = subparsers.add_parser("cost", help="price speculative decoding: TCO, break-even, sensitivity, advice")
    add_db_option(cost)
    source = cost.add_mutually_exclusive_group()
    source.add_argument(
        "--last",
        metavar="SECONDS",
        type=positive,
        default=None,
        help=f"measure the last SECONDS of the store (default {MONTH_S}, 30 days)",
    )
    source.add_argument(
        "--what-if",
        metavar="FILE.toml",
        type=Path,
        default=None,
        help="inputs from a TOML file instead of the store (keys: cost/cost_example.toml)",
    )
    add_price_options(cost, gpu_default="the what-if file's, else the sampled device's")
    cost.add_argument(
        "--volume",
        metavar="TOKENS",
        type=positive,
        default=None,
        help="output tokens per month to price (default: the observed volume)",
    )
    add_model_options(cost)
    cost.add_argument(
        "--tag",
        metavar="KEY=VALUE",
        action="append",
        default=[],
        type=tag_filter,
        help="a view: the requests with this tag (repeatable), e.g. tenant=acme; they are charged their own "
        "work and their share of idle by device time, and the rest of the bill is an outside_view line",
    )
    cost.add_argument("--json", action="store_true", help="print the whole model as JSON")
    cost.add_argument(
        "--xlsx",
        metavar="FILE",
        type=Path,
        default=None,
        help="also write the model as a spreadsheet with live formulas over an Inputs sheet",
    )
    cost.add_argument(
        "--focus",
        metavar="FILE.csv",
        type=Path,
        default=None,
        help="also write the bill's lines per day, instance and arm as FinOps FOCUS 1.2 rows (CSV)",
    )
    cost.set_defaults(handler=cost_command)


def tag_filter(text: str) -> tuple[str, str]:
    """KEY=VALUE -> (key, value); argparse turns the ValueError into a usage error (exit 2)."""
    key, sep, value = text.partition("=")
    if not key or not sep or not value:
        raise ValueError(f"a tag is KEY=VALUE, not {text!r}")
    return key, value


def cost_command(args: argparse.Namespace) -> int:
    try:
        summary = _summary(args)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.xlsx is not None:
        _write_xlsx(summary, args.xlsx, ", ".join(f"{k}={v}" for k, v in args.tag) or "all requests")
    if args.focus is not None and summary.window is None:
        from specwatch.cost.focus import focus_rows_of

        _write_focus(args.focus, focus_rows_of(summary.inputs, Window.last(MONTH_S)))
    if args.json:
        import orjson

        sys.stdout.write(orjson.dumps(summary, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY).decode() + "\n")
    else:
        print(render_text(summary))
        for written in (args.xlsx, args.focus):
            if written is not None:
                print(f"\nwrote {written}")
    return 0


def _summary(args: argparse.Namespace) -> CostSummary:
    prices = load_prices(args.prices)
    overrides, hidden = model_overrides(args, monthly_output_tokens=args.volume)
    if args.what_if is not None:
        inputs = what_if_inputs(args.what_if, prices, args.gpu)
        if args.hidden_costs:
            inputs = dataclasses.replace(inputs, hidden=load_hidden_costs(args.hidden_costs, inputs.hidden))
        return summarize(apply_overrides(inputs, overrides), source="what-if")
    return _measured(args, prices, overrides, hidden)


def _measured(args: argparse.Namespace, prices, overrides: Overrides, hidden: HiddenCosts) -> CostSummary:
    from sqlalchemy.exc import OperationalError

    from specwatch.collector.cli import settings_from
    from specwatch.collector.db import is_current, make_db

    db = make_db(settings_from(args).database_url_resolved)
    window = Window.last(args.last or MONTH_S)
    try:
        if not is_current(db):
            raise UsageError("the database schema is not current: run `specwatch db upgrade` first")
        filters = Filters(tags=tuple(args.tag))
        summary = measured_summary(
            db,
            window,
            prices,
            gpu_type=args.gpu,
            overrides=overrides,
            filters=filters,
            hidden=hidden,
            incidents=incident_history(db, window) if args.incidents == "alerts" else None,
        )
        if args.focus is not None:
            from specwatch.cost.focus import measured_focus

            i, edits = summary.inputs, dict(overrides=overrides, hidden=hidden, filters=filters)
            _write_focus(args.focus, measured_focus(db, summary.window, i.prices, gpu_type=i.gpu_type, **edits))
        return summary
    except OperationalError as exc:
        raise UsageError(f"cannot read the database: {str(exc.orig).splitlines()[0]}") from None
    finally:
        db.dispose()


def _write_xlsx(summary: CostSummary, path: Path, view: str) -> None:
    from specwatch.cost.xlsx import write_workbook

    try:
        write_workbook(summary.inputs, path, summary.concurrency, view)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror}") from None


def _write_focus(path: Path, rows: list[dict]) -> None:
    from specwatch.cost.focus import write_focus

    try:
        write_focus(rows, path)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror}") from None
