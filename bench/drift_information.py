"""How much a −15% drop shows in one request, for the per-request statistics a drift detector could use.

    python bench/drift_information.py [--shift 0.15]

For each pool (bench/drift_pools.py) and each statistic z = w(d)·(x − μ) of a request's acceptance
x = accepted / drafted with d drafted tokens, prints the standardised shift δ/σ: the mean change of z
under the bench's binomial thinning (accepted tokens kept with probability 1 − shift) over z's
standard deviation across the pool's requests. A CUSUM's delay at a fixed false-alarm rate goes as
(σ/δ)², so a statistic with a larger δ/σ detects the same drop sooner. Weights:

- `request`: w = 1, per-request acceptance (alerts/drift.py);
- `token`: w = d, accepted − μ·drafted (a token-level CUSUM; μ pooled over tokens);
- `sqrt`: w = √d, (accepted − μ·drafted)/√drafted;
- `beta-binomial`: w = 1 / Var(x | d) with Var(x | d) = μ(1 − μ)(ρ + (1 − ρ)/d), ρ the intra-request
  correlation by moments (the quasi-likelihood weight of an overdispersed binomial);
- `rank`: the request's mid-rank in the pool (a distribution-free statistic), scaled by 1 − shift;
- `asin`: w = 1 on asin√x, the binomial's variance-stabilising scale;
- `√d·asin` (the detector's, alerts/drift.py): w = √d on asin√x.

The two asin statistics are not linear in x: their mean change is measured over 400 binomial
thinnings of every request (seed 0) rather than taken as shift·E[w·x].
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.drift_pools import ENGINE_RECORDS, HALVES, VLLM_RECORDS, Pool, engine_pool, split, vllm_pool  # noqa: E402


def weighted(pool: Pool, w: np.ndarray, shift: float) -> float:
    """δ/σ of w·(x − μ_w), μ_w the w-weighted mean: mean change shift·E[w·x] over the spread."""
    x = pool.acceptance
    mu = np.sum(w * x) / np.sum(w)
    return float(shift * np.mean(w * x) / np.std(w * (x - mu)))


def overdispersion(pool: Pool) -> float:
    """ρ by moments: Var(x) = μ(1 − μ)(ρ + (1 − ρ)·E[1/d])."""
    x, inv = pool.acceptance, float(np.mean(1.0 / pool.drafted))
    pq = x.mean() * (1 - x.mean())
    return float(np.clip((x.var() / pq - inv) / (1 - inv), 0.0, 1.0))


def rank_shift(pool: Pool, shift: float) -> float:
    x = np.sort(pool.acceptance)

    def midrank(v):
        return (np.searchsorted(x, v, "left") + np.searchsorted(x, v, "right")) / (2 * len(x))

    u = midrank(pool.acceptance)
    return float((u.mean() - midrank((1 - shift) * pool.acceptance).mean()) / u.std())


def thinned(pool: Pool, w: np.ndarray, shift: float, draws: int = 400) -> float:
    """δ/σ of w·(asin√x − m_w), the mean change measured over `draws` thinnings of each request."""
    y = np.arcsin(np.sqrt(pool.acceptance))
    m = np.sum(w * y) / np.sum(w)
    rng = np.random.default_rng(0)
    kept = rng.binomial(pool.accepted, 1.0 - shift, size=(draws, len(y))) / pool.drafted
    return float(np.mean(w * (y - np.arcsin(np.sqrt(kept)))) / np.std(w * (y - m)))


def statistics(pool: Pool, shift: float) -> dict[str, float]:
    d, rho = pool.drafted.astype(float), overdispersion(pool)
    mu = pool.acceptance.mean()
    return {
        "request": weighted(pool, np.ones_like(d), shift),
        "token": weighted(pool, d, shift),
        "sqrt": weighted(pool, np.sqrt(d), shift),
        "beta-binomial": weighted(pool, 1.0 / (mu * (1 - mu) * (rho + (1 - rho) / d)), shift),
        "rank": rank_shift(pool, shift),
        "asin": thinned(pool, np.ones_like(d), shift),
        "√d·asin": thinned(pool, np.sqrt(d), shift),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shift", type=float, default=0.15)
    args = parser.parse_args()
    if not 0 < args.shift < 1:
        parser.error("--shift must be in (0, 1)")
    whole = [engine_pool(ENGINE_RECORDS, "ngram", 8), vllm_pool(VLLM_RECORDS, 8)]
    halves = [(f"{p.name}/{half} {seed}", split(p, half, seed)) for p in whole for seed in range(3) for half in HALVES]
    pools = [(p.name, p) for p in whole] + halves
    names = list(statistics(whole[0], args.shift))
    print(f"δ/σ of a −{args.shift:.0%} drop in one request; ρ = intra-request correlation")
    print("pool (half seed) | ρ    | " + " | ".join(f"{n:>13}" for n in names))
    for label, pool in pools:
        cells = " | ".join(f"{v:13.3f}" for v in statistics(pool, args.shift).values())
        print(f"{label:16} | {overdispersion(pool):.2f} | {cells}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
