"""`specwatch <command>`: each package registers its own subcommands.

Packages are imported lazily, so `specwatch collector ...` never imports torch.
A bad argument or input exits with code 2 and a one-line message.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

from specwatch.common.errors import UsageError

# command -> module that defines `register(subparsers)`; each handler returns an exit code.
COMMANDS = {
    "generate": "specwatch.engine.cli",
    "engine": "specwatch.engine.cli",
    "gateway": "specwatch.gateway.cli",
    "traffic": "specwatch.traffic_cli",
    "collector": "specwatch.service.cli",
    "db": "specwatch.collector.cli",
    "cost": "specwatch.cost_cli",
    "report": "specwatch.report.cli",
    "alerts": "specwatch.alerts.cli",
    "dashboard": "specwatch.dashboard.cli",
    "up": "specwatch.up",
    "vllm": "specwatch.vllm_check",
    "tune": "specwatch.tune_cli",
    "ingest": "specwatch.ingest_cli",
    "draft": "specwatch.draft_cli",
}


def build_parser(command: str | None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specwatch", description="Watch speculative decoding pay off (or not).")
    subparsers = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    modules = {COMMANDS[command]} if command in COMMANDS else sorted(set(COMMANDS.values()))
    for module_name in modules:
        try:
            importlib.import_module(module_name).register(subparsers)
        except ModuleNotFoundError as exc:
            if exc.name != module_name:
                raise
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    command = argv[0] if argv and not argv[0].startswith("-") else None
    args = build_parser(command).parse_args(argv)
    try:
        return int(args.handler(args) or 0)
    except UsageError as exc:
        print(f"specwatch {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:  # the reader went away (`specwatch cost | head`): no traceback
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
