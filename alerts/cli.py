"""`specwatch alerts check | run | export-prometheus`."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from specwatch.alerts.rules import AlertConfig, RulesError, format_duration, load_config
from specwatch.common.errors import UsageError


def register(subparsers: argparse._SubParsersAction) -> None:
    alerts = subparsers.add_parser("alerts", help="alert rules: validate, evaluate, export")
    commands = alerts.add_subparsers(dest="alerts_command", required=True, metavar="SUBCOMMAND")
    check = commands.add_parser("check", help="validate a rules file and list its rules")
    check.add_argument(
        "rules", nargs="?", default=None, help="rules YAML (default: SPECWATCH_ALERT_RULES, else shipped)"
    )
    check.set_defaults(handler=check_command)

    run = commands.add_parser("run", help="evaluate the rules against the store until interrupted")
    run.add_argument("--rules", default=None, help="rules YAML (default: SPECWATCH_ALERT_RULES, else shipped)")
    run.add_argument("--db", metavar="URL", default=None, help="SQLAlchemy URL (default: as the collector)")
    run.add_argument("--once", action="store_true", help="one evaluation cycle, print it, deliver what is due, exit")
    run.set_defaults(handler=run_command)

    export = commands.add_parser(
        "export-prometheus", help="write the rules as a Prometheus rule file (+ promtool tests)"
    )
    export.add_argument("--rules", default=None, help="rules YAML (default: SPECWATCH_ALERT_RULES, else shipped)")
    export.add_argument("--out", default=".", help="directory for specwatch-rules.yaml and specwatch-rules.test.yaml")
    export.set_defaults(handler=export_command)


def _config(path: str | None) -> AlertConfig:
    try:
        return load_config(path)
    except RulesError as exc:
        raise UsageError(str(exc)) from None


def check_command(args: argparse.Namespace) -> int:
    config = _config(args.rules)
    for rule in config.rules:
        print(
            f"{rule.name:<36} {rule.signal} {rule.op} {rule.threshold:g} over {format_duration(rule.window)}"
            f" for {format_duration(rule.for_)} -> {', '.join(rule.actions) or 'notify'}"
        )
    print(f"{len(config.rules)} rules, {len(config.receivers)} receivers: OK")
    return 0


def run_command(args: argparse.Namespace) -> int:
    from specwatch.alerts.runner import AlertRunner
    from specwatch.collector.cli import migrated_db, settings_from

    config = _config(args.rules)
    settings = settings_from(args)
    db = migrated_db(settings)
    runner = AlertRunner(db, config, external_url=settings.external_url)
    try:
        if args.once:
            report = runner.cycle()
            for t in report.transitions:
                print(f"{t.rule} {t.labels}: {t.from_state} -> {t.to_state} (value {t.value:.3g})")
            for rule, error in report.errors.items():
                print(f"{rule}: signal failed: {error}")
            print(
                f"{len(config.rules)} rules in {report.duration_s * 1000:.1f} ms, "
                f"{report.notifications} notifications queued, "
                f"{runner.deliver()} delivered, {len(report.actions)} actions"
            )
        else:
            asyncio.run(runner.run())
    finally:
        runner.close()
        db.dispose()
    return 0


def export_command(args: argparse.Namespace) -> int:
    from specwatch.alerts.prometheus import export

    config = _config(args.rules)
    try:
        rules_path, tests_path = export(config, Path(args.out))
    except RulesError as exc:
        raise UsageError(str(exc)) from None
    print(
        f"wrote {rules_path} and {tests_path}\n"
        f"check them with: promtool check rules {rules_path} && promtool test rules {tests_path}"
    )
    return 0
