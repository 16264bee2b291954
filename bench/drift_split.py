"""Choose the drift detector's decision interval on one random half of each pool, check it on the other.

    python bench/drift_split.py [--grid 32 35 38] [--runs 20] [--rules alerts/default_rules.yaml]

Guards against fitting the two recorded pools: each pool (bench/drift_pools.py) is halved at random
(`split`, seed 0); every h of `--grid` is measured on the `tune` halves only (bench/drift.py's
streams), and the chosen h is the smallest at which every tune half's false-alarm rate is below
1 per day with 95% confidence (the one-sided Poisson upper bound of the alarms counted over the
runs' days: 0.75 a day seen over 20 days is not enough, its bound is 1.15), else the grid's
largest. The delay shortens as h falls, so this is also the fastest h that keeps the goal. The
table then gives the chosen h on the `holdout` halves, which played no part in the choice. ONE h
for all pools: no per-pool tuning.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scipy.stats import chi2  # noqa: E402

from bench import drift  # noqa: E402
from bench.drift_pools import ENGINE_RECORDS, VLLM_RECORDS, engine_pool, split, vllm_pool  # noqa: E402
from specwatch.alerts.rules import load_config  # noqa: E402


def upper_bound(alarms: int, days: float, confidence: float = 0.95) -> float:
    """One-sided upper confidence bound of a Poisson rate per day (exact, by the chi-squared quantile)."""
    return float(chi2.ppf(confidence, 2 * (alarms + 1)) / (2 * days))


def quiet(results: dict) -> bool:
    stationary = results["stationary 24 h"]  # each run is one day of requests
    return upper_bound(stationary["false_alarms"], stationary["runs"]) < drift.FALSE_ALARMS_GOAL


def choose(by_h: dict[float, list[dict]]) -> float:
    """The smallest h at which every tune half is `quiet`; else the largest."""
    return min((h for h, rs in by_h.items() if all(quiet(r) for r in rs)), default=max(by_h))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grid", nargs="+", type=float, default=[32.0, 35.0, 38.0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--rules", type=Path, default=None)
    args = parser.parse_args()
    if args.runs < 1 or min(args.grid) <= 0:
        parser.error("--runs must be >= 1 and every --grid value > 0")
    base = load_config(args.rules).detectors.drift
    floor = base.min_drafted_tokens
    pools = [engine_pool(ENGINE_RECORDS, "ngram", floor), vllm_pool(VLLM_RECORDS, floor)]
    tune, holdout = [split(p, "tune") for p in pools], [split(p, "holdout") for p in pools]
    by_h, rows = {}, []
    for h in args.grid:
        settings = base.model_copy(update={"decision_interval": h})
        by_h[h] = [drift.measure(p, settings, 1.0, args.runs, 0) for p in tune]
        rows += [(f"h={h:g} {p.name}", *drift.row(p, r)[1:]) for p, r in zip(tune, by_h[h])]
        print(f"h={h:g}: tune halves measured", flush=True)
    chosen = choose(by_h)
    settings = base.model_copy(update={"decision_interval": chosen})
    for p in holdout:
        rows.append((f"h={chosen:g} {p.name}", *drift.row(p, drift.measure(p, settings, 1.0, args.runs, 1))[1:]))
    print(f"chosen on the tune halves: decision_interval = {chosen:g} (shipped: {base.decision_interval:g})")
    print(drift.table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
