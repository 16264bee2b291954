"""`specwatch cost`: the TCO of speculative decoding for a window of the store, or for what-if inputs.

specwatch cost [--db URL] [--last SECONDS]           measured (default: the last 30 days)
specwatch cost --what-if FILE.toml                   inputs from TOML (cost/cost_example.toml)
    [--gpu TYPE] [--prices FILE] [--pricing on-demand|spot|reserved|on-prem] [--volume TOKENS]
    [--hidden-costs FILE.toml] [--incidents seed|alerts] [--idle-allocation separate|by_share]
    [--json] [--xlsx FILE]
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import sys
from pathlib import Path

from collector.cli import add_db_option
from collector.queries import Window
from common.errors import UsageError
from cost.inputs import Overrides, apply_overrides, load_hidden_costs, load_prices, what_if_inputs
from cost.model import PRICINGS, HiddenCosts
from cost.summary import MONTH_S, CostSummary, measured_summary, render_text, summarize


def _positive(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {value!r}") from None
    if not math.isfinite(number) or number <= 0:
        raise argparse.ArgumentTypeError(f"must be a positive number: {value!r}")
    return number


def add_price_options(parser: argparse.ArgumentParser, gpu_default: str = "the sampled device's") -> None:
    """--gpu and --prices: which accelerator of which price table (`cost` and `report` take both)."""
    parser.add_argument(
        "--gpu", metavar="TYPE", default=None, help=f"accelerator of the price table (default: {gpu_default})"
    )
    parser.add_argument(
        "--prices",
        metavar="FILE.toml",
        type=Path,
        default=None,
        help="price table (default: the shipped cost/prices.toml)",
    )


def add_model_options(parser: argparse.ArgumentParser) -> None:
    """How to price: pricing, hidden-cost overrides, incident source, idle allocation (`cost` and `report`)."""
    parser.add_argument("--pricing", choices=PRICINGS, default=None, help="price of a GPU-hour (default: on-demand)")
    parser.add_argument(
        "--hidden-costs",
        metavar="FILE.toml",
        type=Path,
        default=None,
        help="hidden-cost overrides (keys of [hidden] in cost/cost_example.toml); shown with source 'given'",
    )
    parser.add_argument(
        "--incidents",
        choices=("seed", "alerts"),
        default="seed",
        help="incident time: the seed's 2 person-days/week, or derived from the alert history (default: seed)",
    )
    parser.add_argument(
        "--idle-allocation",
        choices=("separate", "weighted", "even", "by_share"),
        default=None,
        help="idle device time as its own line (default), or shared over the arms by device time (weighted, "
        "by_share) or evenly",
    )
    parser.add_argument(
        "--reserve-base",
        choices=("additions", "deployment"),
        default=None,
        help="the technical-debt reserve's base: what speculation adds (default) or its whole deployment",
    )


def model_overrides(args: argparse.Namespace, **more) -> tuple[Overrides, HiddenCosts]:
    """The pricing options as Overrides, and the hidden costs a --hidden-costs file gives (ValueError: bad file)."""
    hidden = load_hidden_costs(args.hidden_costs) if args.hidden_costs else HiddenCosts()
    reserve = getattr(args, "reserve_base", None)
    return Overrides(pricing=args.pricing, idle_allocation=args.idle_allocation, reserve_base=reserve, **more), hidden


def register(subparsers: argparse._SubParsersAction) -> None:
    cost = subparsers.add_parser("cost", help="price speculative decoding: TCO, break-even, sensitivity, advice")
    add_db_option(cost)
    source = cost.add_mutually_exclusive_group()
    source.add_argument(
        "--last",
        metavar="SECONDS",
        type=_positive,
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
        type=_positive,
        default=None,
        help="output tokens per month to price (default: the observed volume)",
    )
    add_model_options(cost)
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


def cost_command(args: argparse.Namespace) -> int:
    try:
        summary = _summary(args)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if args.xlsx is not None:
        _write_xlsx(summary, args.xlsx)
    if args.focus is not None and summary.window is None:
        from cost.focus import focus_rows_of

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

    from collector.cli import settings_from
    from collector.db import is_current, make_engine

    engine = make_engine(settings_from(args).database_url_resolved)
    try:
        if not is_current(engine):
            raise UsageError("the database schema is not current: run `specwatch db upgrade` first")
        summary = measured_summary(
            engine,
            Window.last(args.last or MONTH_S),
            prices,
            gpu_type=args.gpu,
            overrides=overrides,
            hidden=hidden,
            incidents_from_alerts=args.incidents == "alerts",
        )
        if args.focus is not None:
            from cost.focus import measured_focus

            i = summary.inputs
            rows = measured_focus(
                engine, summary.window, i.prices, gpu_type=i.gpu_type, overrides=overrides, hidden=hidden
            )
            _write_focus(args.focus, rows)
        return summary
    except OperationalError as exc:
        raise UsageError(f"cannot read the database: {str(exc.orig).splitlines()[0]}") from None
    finally:
        engine.dispose()


def _write_xlsx(summary: CostSummary, path: Path) -> None:
    from cost.xlsx import write_workbook

    try:
        write_workbook(summary.inputs, path)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror}") from None


def _write_focus(path: Path, rows: list[dict]) -> None:
    from cost.focus import write_focus

    try:
        write_focus(rows, path)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror}") from None
