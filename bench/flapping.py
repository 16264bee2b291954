"""Replicas over time under a load step, with and without the HPA's 90 s scale-down window.

    python bench/flapping.py [--window 90] [--seed 1] [--json out.json]

A synthetic trace, one second a step: demand is 1,800 output tokens/s for 5 minutes, then steps
to 5,200 for 15 minutes (5% noise). Each pod of the speculative pool serves `SPEC_TPS` tokens/s
with speculation on and `PLAIN_TPS` with it off. Speculation switches off for stretches of 30-90 s
and back on for as long (low-acceptance episodes: a burst of open-chat prompts, the acceptance
alert's remediation). (The gateway's load fallback, off above load 0.75 and on below 0.60, is left
out: under an HPA that holds utilisation at 0.8 it turns speculation off for good, a steady
state.) Each switch moves capacity by 1.8x at once, which is what makes replicas flap: speculation off -> utilisation
up -> scale up -> speculation on -> capacity up -> scale down -> speculation off -> ...

The autoscaler is the HPA's algorithm (autoscaling/v2, every 15 s): desired = ceil(replicas *
utilisation / 0.8) outside a 10% tolerance; scale-up at most max(+2 pods, +50%) a minute
(deploy/kubernetes/hpa.yaml); scale-down takes the highest recommendation of the last `window`
seconds, at most -50% a minute. A new pod serves after 60 s (model load). Utilisation =
demand over the last minute / (replicas * the capacity gauge) (the HPA's own replica count), the
gauge either raw (tokens/s of the current mode) or smoothed as `collector.reads.capacity.estimate`
computes it from per-request records.

Prints, per variant, the scale events, the reversals (a scale-down followed by a scale-up or back:
flaps), pod-minutes, the seconds when ready capacity was below demand, and replicas every 30 s.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specwatch.collector.reads.capacity import CapacityRules, Served, estimate  # noqa: E402

SPEC_TPS, PLAIN_TPS = 900.0, 500.0  # tokens/s one pod serves: speculation on (input-grounded prompts), off
TARGET, TOLERANCE = 0.8, 0.1
SYNC_S, POD_START_S, DURATION_S, STEP_AT_S = 15, 60, 1200, 300
MIN_PODS, MAX_PODS = 2, 16


@dataclass(frozen=True)
class Result:
    variant: str
    window_s: int
    smoothed: bool
    scale_events: int
    reversals: int
    pod_minutes: float
    short_s: int  # seconds with ready capacity below demand
    replicas: tuple[int, ...]  # every 30 s


def demand_trace(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    base = np.where(np.arange(DURATION_S) < STEP_AT_S, 1800.0, 5200.0)
    return base * rng.normal(1.0, 0.05, DURATION_S)


def episodes(seed: int) -> np.ndarray:
    """True where speculation may run: alternating stretches, on 30-90 s, off 30-90 s."""
    rng, allowed, t, on = np.random.default_rng(seed + 1000), np.ones(DURATION_S, dtype=bool), 0, True
    while t < DURATION_S:
        length = int(rng.integers(30, 91))
        allowed[t : t + length] = on
        t, on = t + length, not on
    return allowed


class Pool:
    """Pods (starting and ready), whether speculation runs, and the per-request records."""

    def __init__(self, pods: int) -> None:
        self.ready_at = [0.0] * pods  # when each pod serves
        self.spec_on = True
        self.served: deque[Served] = deque(maxlen=int(3 * CapacityRules().tau_s))

    def ready(self, t: float) -> int:
        return sum(1 for at in self.ready_at if at <= t)

    def step(self, t: float, demand: float, allowed: bool) -> bool:
        """One second: speculation as the episode says, serve, record; True when capacity fell short."""
        self.spec_on = allowed
        per_pod = SPEC_TPS if self.spec_on else PLAIN_TPS
        self.served.append(Served(t, 64, 64 / per_pod))  # one pod's tokens per device-second now
        return self.ready(t) * per_pod < demand

    def resize(self, t: float, pods: int) -> None:
        if pods > len(self.ready_at):
            self.ready_at += [t + POD_START_S] * (pods - len(self.ready_at))
        else:
            self.ready_at = sorted(self.ready_at)[:pods]  # the newest go first


def gauge(pool: Pool, t: float, smoothed: bool) -> float:
    if not smoothed:
        return SPEC_TPS if pool.spec_on else PLAIN_TPS
    return estimate(list(pool.served), t) or SPEC_TPS


class Hpa:
    """The HPA's replica calculation with a scale-down stabilisation window and bounded scale-up."""

    def __init__(self, window_s: int) -> None:
        self.window_s = window_s
        self.recommendations: deque[tuple[float, int]] = deque()
        self.history: deque[tuple[float, int]] = deque()  # (t, replicas) for the per-minute rate limits

    def decide(self, t: float, replicas: int, utilisation: float) -> int:
        ratio = utilisation / TARGET
        wanted = replicas if abs(ratio - 1) <= TOLERANCE else math.ceil(replicas * ratio)
        wanted = min(max(wanted, MIN_PODS), MAX_PODS)
        self.recommendations.append((t, wanted))
        while self.recommendations[0][0] < t - self.window_s:
            self.recommendations.popleft()
        stable = max(w for _, w in self.recommendations) if wanted < replicas else wanted
        return self._rate_limited(t, replicas, stable)

    def _rate_limited(self, t: float, replicas: int, wanted: int) -> int:
        while self.history and self.history[0][0] < t - 60:
            self.history.popleft()
        base = min([r for _, r in self.history] + [replicas]) if wanted > replicas else replicas
        top = max([r for _, r in self.history] + [replicas])
        decided = min(wanted, max(base + 2, math.ceil(base * 1.5))) if wanted > replicas else max(wanted, top // 2)
        self.history.append((t, decided))
        return decided


def simulate(demand: np.ndarray, allowed: np.ndarray, window_s: int, smoothed: bool) -> Result:
    pool, hpa, replicas = Pool(4), Hpa(window_s), 4
    events, directions, pod_s, short, every_30 = 0, [], 0, 0, []
    for t, load in enumerate(demand):
        short += pool.step(float(t), float(load), bool(allowed[t]))
        pod_s += len(pool.ready_at)
        if t % SYNC_S == 0 and t > 0:
            recent = float(np.mean(demand[max(0, t - 60) : t]))  # rate over the last minute
            utilisation = recent / max(replicas * gauge(pool, t, smoothed), 1.0)
            decided = hpa.decide(float(t), replicas, utilisation)
            if decided != replicas:
                events += 1
                directions.append(1 if decided > replicas else -1)
                replicas = decided
                pool.resize(float(t), replicas)
        if t % 30 == 0:
            every_30.append(replicas)
    reversals = sum(1 for a, b in zip(directions, directions[1:]) if a != b)
    name = f"window {window_s:>2} s, {'smoothed' if smoothed else 'raw'} gauge"
    return Result(name, window_s, smoothed, events, reversals, pod_s / 60, short, tuple(every_30))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--window", type=int, default=90, help="the scale-down window to compare with 0 (s)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if not 0 < args.window <= 3600:
        parser.error("--window must be in (0, 3600]")
    demand, allowed = demand_trace(args.seed), episodes(args.seed)
    results = [simulate(demand, allowed, w, s) for w in (0, args.window) for s in (False, True)]
    print(f"{'variant':<30} {'scale events':>12} {'reversals':>9} {'pod-min':>8} {'short s':>8}")
    for r in results:
        print(f"{r.variant:<30} {r.scale_events:>12} {r.reversals:>9} {r.pod_minutes:>8.1f} {r.short_s:>8}")
    print("\nreplicas every 30 s (the load steps at t = 300 s):")
    for r in results:
        print(f"{r.variant:<30} {' '.join(map(str, r.replicas))}")
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
