"""`python -m specwatch.grafana [--rules FILE] [--out DIR]`: write the Grafana dashboards
(dashboard/grafana/build.py) with the thresholds of the loaded, validated alert rules (the shipped
rules, SPECWATCH_ALERT_RULES, or FILE). A bad rules file exits 2 with the rule and field named."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from specwatch.alerts.rules import RulesError, load_config
from specwatch.dashboard.grafana.build import HERE, write


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Write the Grafana dashboards, thresholds from the alert rules.")
    parser.add_argument("--rules", default=None, help="alert rules YAML (default: SPECWATCH_ALERT_RULES, else shipped)")
    parser.add_argument("--out", type=Path, default=HERE, help="directory to write into (default: dashboard/grafana)")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.rules)
    except RulesError as exc:
        print(f"specwatch.grafana: cannot read the alert thresholds: {exc}", file=sys.stderr)
        return 2
    for path in write(config, args.out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
