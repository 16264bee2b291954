"""One alert evaluation cycle (every shipped rule, persisted) over a large SQLite store.

    .venv/bin/python bench/alerts.py [--rows 1000000] [--days 1] [--db PATH] [--repeat 10]

Fills a SQLite store with `--rows` requests spread over the last `--days` days (bench/query.py's
loader; `--days 1` puts ~3,500 requests in every 5-minute window) plus one device sample per
instance every 5 s, then times `AlertRunner.cycle`: all rules of alerts/default_rules.yaml
evaluated, their states, transitions and health written. Goal: < 200 ms per cycle.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

import numpy as np  # noqa: E402
from query import DAY, load  # noqa: E402
from sqlalchemy import func, insert, select  # noqa: E402

from specwatch.alerts.rules import load_config  # noqa: E402
from specwatch.alerts.runner import AlertRunner  # noqa: E402
from specwatch.alerts.tables import alert_rule_health  # noqa: E402
from specwatch.collector.db import make_db, upgrade  # noqa: E402
from specwatch.collector.models import DeviceSampleRow, Request  # noqa: E402

GOAL_S = 0.2


def add_device_samples(db, start: float, end: float, instances: int = 4) -> int:
    rng = np.random.default_rng(7)
    at = np.arange(start, end, 5.0)
    rows = [
        {
            "instance": f"gpu-{k}",
            "at": float(t),
            "device": "cpu",
            "mem_allocated_bytes": 10**9,
            "mem_reserved_bytes": int(10**9 * f),
            "fragmentation": float(f),
            "power_w": 60.0,
            "power_source": "estimate",
            "util_target": 0.6,
            "util_draft": float(u),
            "active_requests": 2,
            "queue_depth": 0,
            "load": 0.5,
            "draft_loaded": True,
            "default_mode": "speculative",
        }
        for k in range(instances)
        for t, f, u in zip(at, rng.uniform(1.0, 1.4, len(at)), rng.uniform(0, 0.5, len(at)))
    ]
    with db.begin() as conn:
        for first in range(0, len(rows), 50_000):
            conn.execute(insert(DeviceSampleRow), rows[first : first + 50_000])
    return len(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--days", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--db", type=Path, help="SQLite file to create (or reuse if it exists)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="specwatch-alerts-") as tmp:
        path = args.db or Path(tmp) / "bench.db"
        db = make_db(f"sqlite:///{path}")
        upgrade(db)
        with db.connect() as conn:
            have, newest = conn.execute(select(func.count(), func.max(Request.started_at))).one()
        now = newest if have else time.time()
        if not have:
            seconds = load(path, args.rows, args.days, now)
            print(f"loading {args.rows:,} requests over {args.days:g} days ... {seconds:.1f} s")
            print(f"adding {add_device_samples(db, now - args.days * DAY, now):,} device samples")
        run(db, now, args.repeat)
        db.dispose()


def run(db, now: float, repeat: int) -> None:
    with db.connect() as conn:
        stored = conn.scalar(select(func.count()).select_from(Request))
        in_window = conn.scalar(select(func.count()).where(Request.started_at >= now - 300))
    config = load_config()
    runner = AlertRunner(db, config)
    runner.cycle(now)  # warm-up: imports, page cache
    times = []
    for i in range(repeat):
        report = runner.cycle(now + 1e-3 * (i + 1))
        times.append(report.duration_s)
    runner.close()
    with db.connect() as conn:
        per_rule = conn.execute(
            select(alert_rule_health.c.rule, alert_rule_health.c.duration_s, alert_rule_health.c.error)
        ).all()
    print(f"store: {stored:,} requests, {in_window:,} in the last 5 minutes; {len(config.rules)} rules")
    for rule, seconds, error in sorted(per_rule, key=lambda r: -r[1]):
        print(f"  {rule:<36} {seconds * 1000:7.1f} ms{'  ERROR ' + error if error else ''}")
    median = statistics.median(times)
    print(
        f"evaluation cycle (median of {repeat}): {median * 1000:.1f} ms, max {max(times) * 1000:.1f} ms; "
        f"goal < {GOAL_S * 1000:.0f} ms: {'met' if median < GOAL_S else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
