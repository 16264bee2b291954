"""Query latency over a large store: the signals alerts evaluate, and long-window series.

    .venv/bin/python bench/query.py [--rows 1000000] [--days 30] [--db PATH]

Fills a SQLite store (the collector's schema) with `--rows` requests spread over the last
`--days` days (bulk-loaded with raw executemany; `--db` keeps and reuses the file), folds
them into the per-minute rollups, then times each query (median of `--repeat` runs):
  * 5-minute window signals (acceptance mean/stddev, TTFT/e2e/TPOT P99, ...): goal < 200 ms
  * the 30-day per-hour series from rollups: goal < 1 s (and, for comparison, from raw rows)
"""

from __future__ import annotations

import argparse
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from specwatch.collector.db import make_db, upgrade  # noqa: E402
from specwatch.collector.ingest.store import REQUESTS  # noqa: E402
from specwatch.collector.reads.history import errors_by_hour_long, long_series  # noqa: E402
from specwatch.collector.reads.long_signals import long_signals  # noqa: E402
from specwatch.collector.reads.queries import (  # noqa: E402
    Filters,
    Window,
    acceptance_vs_length,
    errors_by_hour,
    per_position_acceptance,
    signals,
)
from specwatch.collector.reads.series import latest_device_samples, series  # noqa: E402
from specwatch.collector.tiers.rollups import roll_up  # noqa: E402

DAY = 86400.0


def generate(n: int, start: float, end: float, seed: int = 1, first: int = 0) -> list[dict]:
    """n request rows, keyed by column name, with plausible, varied values; ids count from `first`.
    Columns left out (drafts_per_position, mean_lookahead, ...) take their defaults in the table."""
    rng = np.random.default_rng(seed)
    started = np.sort(rng.uniform(start, end, n))
    spec = rng.random(n) < 0.75
    drafts = np.where(spec, rng.integers(4, 40, n), 0)
    p = rng.beta(6, 3, n)  # per-token acceptance
    per_pos = np.stack([np.floor(drafts * p ** (k + 1)) for k in range(4)], axis=1).astype(int)
    ttft = rng.gamma(2.0, 0.04, n)
    e2e = ttft + rng.gamma(3.0, 0.4, n)
    prompt, output = rng.integers(16, 4000, n), rng.integers(8, 512, n)
    status = np.where(rng.random(n) < 0.01, "error", "ok")
    tags = ['{"tenant":"acme"}', '{"tenant":"globex"}', '{"tenant":"initech"}']
    device_s = e2e * np.where(spec, 0.45, 0.35)  # attributed device time: a share of the request's span
    rows = []
    for i in range(n):
        s = bool(spec[i])
        pp = per_pos[i].tolist() if s else []
        rows.append(
            {
                "request_id": f"req-{first + i:09d}",
                "instance": f"gpu-{i % 4}",
                "model": "smollm2-135m",
                "drafter": "ngram" if s else None,
                "mode": "speculative" if s else "autoregressive",
                "mode_reason": "default",
                "arm": None,
                "started_at": float(started[i]),
                "queue_s": 0.001,
                "ttft_s": float(ttft[i]),
                "e2e_s": float(e2e[i]),
                "prompt_tokens": int(prompt[i]),
                "output_tokens": int(output[i]),
                "num_drafts": int(drafts[i]),
                "num_draft_tokens": int(drafts[i]) * 4,
                "num_accepted_tokens": sum(pp),
                "accepted_per_position": str(pp).replace(" ", ""),
                "gamma": 4 if s else 0,
                "draft_s": 0.05,
                "verify_s": 0.4,
                "retries": 0,
                "status": str(status[i]),
                "error": "target:oom" if status[i] == "error" and i % 3 == 0 else None,
                "energy_j": None,
                "energy_source": None,
                "load_at_admission": None,
                "tags": tags[i % 3],
                "draft_counts_known": True,
                "device_s": float(device_s[i]),
                "device_s_source": "engine",
            }
        )
    return rows


def as_tuples(rows: list[dict]) -> tuple[list[str], list[tuple]]:
    """The rows' columns (in the table's order) and the rows as tuples in that order, for executemany
    or COPY; a name the requests table lacks is refused (a renamed column can't be dropped silently)."""
    names = set(rows[0]) if rows else set()
    if unknown := names - set(REQUESTS.columns):
        raise SystemExit(f"bench rows name columns the requests table lacks: {sorted(unknown)}")
    columns = [c for c in REQUESTS.columns if c in names]
    return columns, [tuple(row[c] for c in columns) for row in rows]


def insert_sql(columns: list[str]) -> str:
    """SQLite's INSERT naming `columns`: the ones left out take the table's defaults."""
    return f"INSERT INTO requests ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"


def load(path: Path, rows: int, days: float, now: float) -> float:
    db = make_db(f"sqlite:///{path}")
    upgrade(db)
    db.dispose()
    conn = sqlite3.connect(path, isolation_level=None)
    started = time.perf_counter()
    chunk = 100_000
    for first in range(0, rows, chunk):
        columns, data = as_tuples(generate(min(chunk, rows - first), now - days * DAY, now, seed=first, first=first))
        conn.execute("BEGIN")
        conn.executemany(insert_sql(columns), data)
        conn.execute("COMMIT")
    conn.close()
    return time.perf_counter() - started


def timed(fn, repeat: int) -> tuple[float, object]:
    """Median seconds over `repeat` runs, after one warm-up run (imports, page cache)."""
    result = fn()
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--days", type=float, default=30.0)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--db", type=Path, help="SQLite file to create (or reuse if it exists)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="specwatch-query-") as tmp:
        path = args.db or Path(tmp) / "bench.db"
        db = make_db(f"sqlite:///{path}")
        upgrade(db)
        with db.connect() as conn:
            from sqlalchemy import text

            have = conn.scalar(text("SELECT count(*) FROM requests"))
            newest = conn.scalar(text("SELECT max(started_at) FROM requests"))
        now = newest if have else time.time()
        if not have:
            seconds = load(path, args.rows, args.days, now)
            print(f"loading {args.rows:,} requests over {args.days:g} days ... {seconds:.1f} s")
            have = args.rows
        t = time.perf_counter()
        folded = roll_up(db, now=now).rows_folded
        print(f"rolled up {folded:,} new requests in {time.perf_counter() - t:.1f} s; store holds {have:,} requests")
        run_queries(db, now, args)
        db.dispose()


def run_queries(db, now: float, args) -> None:
    last5 = Window(now - 300 + 1e-6, now + 1e-6)
    hour_start = (now - args.days * DAY) // 3600 * 3600
    month = Window(hour_start, hour_start + (args.days * 24 + 1) * 3600)
    checks = [
        ("5-min signals (acceptance mean/sd, TTFT P99, ...)", lambda: signals(db, last5), 0.2),
        (
            "5-min signals, instance + tag filter",
            lambda: signals(db, last5, Filters(instance="gpu-1", tags=(("tenant", "acme"),))),
            0.2,
        ),
        ("24-hour signals (for scale)", lambda: signals(db, Window(now - DAY, now + 1e-6)), None),
        ("5-min per-position acceptance", lambda: per_position_acceptance(db, last5), 0.2),
        ("5-min per-minute series", lambda: series(db, last5, step_s=60), 0.2),
        (
            "1-hour acceptance vs length (Spearman)",
            lambda: acceptance_vs_length(db, Window(now - 3600, now + 1)),
            None,
        ),
        (f"{args.days:g}-day signals from rollups (+ raw edges)", lambda: long_signals(db, month), 1.0),
        (f"{args.days:g}-day per-hour series from rollups", lambda: long_series(db, month, step_s=3600), 1.0),
        (f"{args.days:g}-day per-hour series from raw rows", lambda: series(db, month, step_s=3600), None),
        (f"{args.days:g}-day errors by hour of day from rollups", lambda: errors_by_hour_long(db, month), 1.0),
        (f"{args.days:g}-day errors by hour of day from raw rows", lambda: errors_by_hour(db, month), None),
        ("latest device samples", lambda: latest_device_samples(db), None),
    ]
    print(f"{'query':<52} {'median':>10}  goal")
    for name, fn, goal in checks:
        seconds, _ = timed(fn, args.repeat if goal is not None else max(1, args.repeat // 2))
        verdict = "" if goal is None else f"< {goal * 1000:.0f} ms: {'met' if seconds < goal else 'NOT met'}"
        print(f"{name:<52} {seconds * 1000:>8.1f} ms  {verdict}")
    rolled, raw = long_series(db, month, step_s=3600), series(db, month, step_s=3600)
    same = all(a.requests == b.requests and a.accepted_tokens == b.accepted_tokens for a, b in zip(rolled, raw))
    print(f"rollup series equals raw series in counts: {same}")


if __name__ == "__main__":
    main()
