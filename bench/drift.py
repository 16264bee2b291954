"""Drift detection on synthetic streams built from real per-request acceptance.

    python bench/drift.py [--records bench/data/engine_acceptance.jsonl] [--rate 1.0] [--runs 20]
                          [--rules alerts/default_rules.yaml] [--json out.json]

Each synthetic request resamples a real request of the bundled engine (its drafted and accepted
tokens, recorded by bench/drift_record.py; n-gram drafter, the workload's prompt kinds, greedy and
sampled) and, for a shift by factor f, keeps each accepted token with probability f (binomial
thinning: the mean acceptance moves by exactly f, the spread stays the requests' own). Requests
arrive as a Poisson stream at `--rate` per second per series. The recorded vLLM responses of
tests/gateway/fixtures are too few to resample (their count is printed) and are not used.

Three streams, each `--runs` times with its own seed, through the detector of `alerts.drift` with
the `detectors.drift` parameters of the rules file:
- step: a -15% step after the warmup and 2 h of baseline; delay from the step to score >= 1;
- slow drift: -10% linearly over 2 h from the same point; delay from the drift's start;
- stationary: 24 h without change; false alarms (alarm onsets) per day.
Prints the median (and 90th percentile) delay in requests and minutes and false alarms per day.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from alerts.detector_settings import DriftSettings  # noqa: E402
from alerts.drift import SeriesState, step  # noqa: E402
from alerts.rules import load_config  # noqa: E402

RECORDS = Path(__file__).with_name("data") / "engine_acceptance.jsonl"
FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "gateway" / "fixtures"
BASELINE_S = 2 * 3600.0


@dataclass(frozen=True)
class Pool:
    drafted: np.ndarray
    accepted: np.ndarray

    @property
    def mean(self) -> float:
        return float(np.mean(self.accepted / self.drafted))


def load_pool(path: Path, drafter: str, min_drafted: int) -> Pool:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    kept = [r for r in rows if r["drafter"] == drafter and r["num_draft_tokens"] >= min_drafted]
    return Pool(np.array([r["num_draft_tokens"] for r in kept]), np.array([r["num_accepted_tokens"] for r in kept]))


def vllm_fixture_requests() -> int:
    """Recorded vLLM responses carrying per-request speculative statistics."""
    return sum(1 for p in FIXTURES.glob("vllm_*") if '"speculative_decoding":{' in p.read_text())


def stream(pool: Pool, factors: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Per-request acceptance of len(factors) requests, each resampled and thinned by its factor."""
    pick = rng.integers(0, len(pool.drafted), size=len(factors))
    accepted = rng.binomial(pool.accepted[pick], factors)
    return accepted / pool.drafted[pick]


def arrivals(n: int, rate: float, rng: np.random.Generator) -> np.ndarray:
    return np.cumsum(rng.exponential(1.0 / rate, size=n))


def alarm_onsets(xs: np.ndarray, settings: DriftSettings) -> list[int]:
    """Indexes at which an alarm starts (the score reaches 1 with no alarm standing)."""
    state, onsets = SeriesState(), []
    for i, x in enumerate(xs):
        before = state.alarm_n
        state = step(state, float(x), float(i), settings)
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
    results["stationary 24 h"] = {"false_alarms_per_day": float(np.mean(alarms)), "runs": runs}
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=Path, default=RECORDS)
    parser.add_argument("--drafter", default="ngram")
    parser.add_argument("--rate", type=float, default=1.0, help="requests per second per series")
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rules", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    settings = load_config(args.rules).detectors.drift
    pool = load_pool(args.records, args.drafter, settings.min_drafted_tokens)
    print(
        f"pool: {len(pool.drafted)} {args.drafter} requests of the bundled engine (mean acceptance {pool.mean:.3f}, "
        f"stddev {np.std(pool.accepted / pool.drafted):.3f}); recorded vLLM responses: {vllm_fixture_requests()} "
        f"(too few to resample); {args.rate:g} requests/s per series, {args.runs} runs each"
    )
    results = measure(pool, settings, args.rate, args.runs, args.seed)
    for name, r in results.items():
        if "false_alarms_per_day" in r:
            print(f"{name:>22}: {r['false_alarms_per_day']:.2f} false alarms per day (goal < 1)")
        else:
            print(
                f"{name:>22}: median delay {r['median_requests']:.0f} requests ({r['median_minutes']:.1f} min), "
                f"p90 {r['p90_requests']:.0f} requests; detected {r['detected']}/{r['runs']}"
            )
    if args.json:
        args.json.write_text(json.dumps({"rate": args.rate, "settings": settings.model_dump(), **results}, indent=2))


if __name__ == "__main__":
    main()
