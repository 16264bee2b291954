"""The pricing options `specwatch cost` and `specwatch report` share (GPU, prices, pricing model, fleet
file, hidden costs, incident source, idle allocation), and the overrides they turn into."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from specwatch.cost.inputs import Overrides, load_fleet, load_hidden_costs, load_prices
from specwatch.cost.model import PRICINGS, HiddenCosts


def positive(value: str) -> float:
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
        "--fleet",
        metavar="FILE.toml",
        type=Path,
        default=None,
        help="what each instance runs on: per instance name, gpu_type, gpu_count, pricing, optional gpu_hour_usd, "
        "commitment, dedicated (docs/cost.md); --gpu still prices every instance as one GPU",
    )
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
    """The pricing options as Overrides, and the hidden costs a --hidden-costs file gives (ValueError: a bad
    hidden-costs or fleet file)."""
    hidden = load_hidden_costs(args.hidden_costs) if args.hidden_costs else HiddenCosts()
    fleet_path = getattr(args, "fleet", None)
    fleet = load_fleet(fleet_path, load_prices(getattr(args, "prices", None))) if fleet_path else None
    chosen = dict(reserve_base=getattr(args, "reserve_base", None), gpu_type=getattr(args, "gpu", None), fleet=fleet)
    return Overrides(pricing=args.pricing, idle_allocation=args.idle_allocation, **chosen, **more), hidden
