"""`specwatch tune recommend`: the k per batch-size bucket that maximises output tokens/s, from the store.

specwatch tune recommend [--db URL] [--last SECONDS | --start EPOCH --end EPOCH]
    [--instance NAME] [--model NAME] [--drafter NAME] [--current-k N | --current-config JSON]
    [--max-k N] [--max-batch N] [--min-requests N] [--min-drafts N] [--profile FILE.json] [--method NAME] [--json]

Prints, per bucket, today's k and the recommended one with predicted tokens/s and their 95% intervals,
the merged ranges, vLLM's `--speculative-config` and TensorRT-LLM's `draft_len_schedule`
(`cost.tuner`, `docs/tuning.md`). Bad input exits 2 with one line.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from specwatch.collector.cli import add_db_option
from specwatch.collector.reads.queries import Filters, Window
from specwatch.common.errors import UsageError
from specwatch.cost.options import positive
from specwatch.cost.tuner import TuneRules
from specwatch.cost.tuner_emit import plan_json, plan_table
from specwatch.tune_canary import register_canary
from specwatch.tune_profile import register_profile

DAY_S = 86_400.0


def _count(value: str) -> int:
    if not value.isdigit() or not 0 <= int(value) <= 64:
        raise argparse.ArgumentTypeError(f"want a whole number from 0 to 64, got {value!r}")
    return int(value)


def _batch(value: str) -> int:
    if not value.isdigit() or not 1 <= int(value) <= 4096:
        raise argparse.ArgumentTypeError(f"want a whole number from 1 to 4096, got {value!r}")
    return int(value)


def _share(value: str) -> float:
    try:
        share = float(value)
    except ValueError:
        share = -1.0
    if not 0.0 <= share <= 1.0:
        raise argparse.ArgumentTypeError(f"want a share from 0 to 1 (0.05: 5%), got {value!r}")
    return share


def register(subparsers: argparse._SubParsersAction) -> None:
    tune = subparsers.add_parser("tune", help="choose the speculation length k per batch size from the store")
    actions = tune.add_subparsers(dest="action", required=True, metavar="ACTION")
    recommend = actions.add_parser("recommend", help="the k schedule that maximises tokens/s, per batch size")
    add_db_option(recommend)
    recommend.add_argument("--last", metavar="SECONDS", type=positive, default=DAY_S, help="window (default 1 day)")
    recommend.add_argument("--start", metavar="EPOCH", type=float, default=None, help="window start (with --end)")
    recommend.add_argument("--end", metavar="EPOCH", type=float, default=None, help="window end (with --start)")
    for name in ("instance", "model", "drafter"):
        recommend.add_argument(f"--{name}", default=None, help=f"only requests of this {name}")
    recommend.add_argument("--current-k", type=_count, default=None, help="today's k (default: the records' gamma)")
    recommend.add_argument(
        "--current-config", metavar="JSON", default=None, help="today's vLLM --speculative-config (a schedule too)"
    )
    recommend.add_argument("--max-k", type=_count, default=TuneRules.max_k, help="largest k to recommend")
    recommend.add_argument("--max-batch", type=_batch, default=TuneRules.max_batch, help="the server's max_num_seqs")
    recommend.add_argument("--min-requests", type=positive, default=TuneRules.min_requests)
    recommend.add_argument("--min-drafts", type=positive, default=TuneRules.min_drafts)
    recommend.add_argument(
        "--min-gain",
        type=_share,
        default=TuneRules.min_gain,
        help="where --profile measured plain and speculation end to end at a level, speculation must make this "
        f"much more tokens/s there, else plain (default {TuneRules.min_gain:g}: 5%%)",
    )
    recommend.add_argument("--profile", metavar="FILE.json", type=Path, default=None, help="step costs per batch & k")
    recommend.add_argument("--method", default=None, help="vLLM method for the config (default: the records')")
    recommend.add_argument("--json", action="store_true", help="print the recommendation as JSON")
    recommend.set_defaults(handler=recommend_command)
    register_profile(actions)  # specwatch/tune_profile.py
    register_canary(actions)  # specwatch/tune_canary.py


def window_of(args: argparse.Namespace) -> Window:
    if (args.start is None) != (args.end is None):
        raise UsageError("give both --start and --end, or --last")
    try:
        return Window(args.start, args.end) if args.start is not None else Window.last(args.last)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def profile_of(path: Path | None):
    """The --profile file as `cost.tuner_data.Profile` (None without one)."""
    from specwatch.cost.tuner_data import read_profile

    if path is None:
        return None
    try:
        return read_profile(json.loads(path.read_text()))
    except (OSError, json.JSONDecodeError, ValueError) as exc:
        raise UsageError(f"--profile {path}: {exc}") from None


def today_of(args: argparse.Namespace) -> dict:
    """current_k (and today's k per level) from --current-k or --current-config."""
    from specwatch.cost.tuner_emit import todays_ks

    if args.current_config is None:
        return {"current_k": args.current_k}
    if args.current_k is not None:
        raise UsageError("give --current-k or --current-config, not both")
    try:
        k, today = todays_ks(json.loads(args.current_config), args.max_batch)
    except (json.JSONDecodeError, ValueError) as exc:
        raise UsageError(f"--current-config: {exc}") from None
    return {"current_k": k, "today": today}


def recommend_command(args: argparse.Namespace) -> int:
    from sqlalchemy.exc import OperationalError

    from specwatch.collector.cli import settings_from
    from specwatch.collector.db import is_current, make_db
    from specwatch.cost.tuner_data import recommend_from_store

    rules = TuneRules(args.min_requests, args.min_drafts, args.max_k, args.max_batch, min_gain=args.min_gain)
    window, profile, today = window_of(args), profile_of(args.profile), today_of(args)
    filters = Filters(instance=args.instance, model=args.model, drafter=args.drafter)
    db = make_db(settings_from(args).database_url_resolved)
    try:
        if not is_current(db):
            raise UsageError("the database schema is not current: run `specwatch db upgrade` first")
        plan = recommend_from_store(db, window, filters, rules=rules, profile=profile, **today)
    except OperationalError as exc:
        raise UsageError(f"cannot read the database: {str(exc.orig).splitlines()[0]}") from None
    finally:
        db.dispose()
    print_plan(plan, args.method, args.json)
    return 0


def print_plan(plan, method: str | None, as_json: bool) -> None:
    found = plan_json(plan, method)
    if as_json:
        import orjson

        sys.stdout.write(orjson.dumps(found, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY).decode() + "\n")
        return
    print("\n".join(plan_table(plan)))
    for what, named in (("acceptance", "acceptance"), ("step_cost", "step cost")):
        print(f"{named} from: {'; '.join(found['sources'][what]) or 'no bucket had data'}")
    print(f"vLLM: {found['vllm_argument'] or 'no speculation: start vLLM without --speculative-config'}")
    print(f"TensorRT-LLM draft_len_schedule: {found['trtllm_draft_len_schedule']}")
    for note in plan.notes:
        print(f"note: {note}")
    for line in plan.comparisons:
        print(f"compared: {line}")
