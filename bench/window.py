"""Window signals with 1,000,000 requests inside the 5-minute window: aggregates vs raw rows.

    .venv/bin/python bench/window.py [--rows 1000000] [--url postgresql+psycopg://...] [--repeat 5]

Loads `--rows` requests whose start times all fall in the last 5 minutes (bench/query.py's
generator, in time-ordered batches of `--batch` rows, like producers' ingest batches) into a fresh
SQLite file (or the empty PostgreSQL database at `--url`): raw rows with executemany (SQLite) or
COPY (PostgreSQL), and each batch's per-second aggregates built and inserted by the functions the
ingest path calls (`aggregates.aggregate` -> `stored_rows` -> `insert_rows`), in the same
transaction. Then, in one run, times (median of `--repeat`, after a warm-up):
  * one alert cycle (every rule of alerts/default_rules.yaml) with StoreSignals from aggregates
    and with StoreSignals(raw=True);
  * what GET /v1/signals?last=300 computes (`long_signals.auto_signals`, aggregates) and the raw-row
    `queries.signals`;
and prints the sketch P99s next to the exact ones. Goal: < 200 ms for the cycle and the signals.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

from query import as_tuples, generate, insert_sql, timed  # noqa: E402
from sqlalchemy import text  # noqa: E402

from specwatch.alerts.rules import load_config  # noqa: E402
from specwatch.alerts.runner import AlertRunner  # noqa: E402
from specwatch.alerts.signals import StoreSignals  # noqa: E402
from specwatch.collector.db import make_db, upgrade  # noqa: E402
from specwatch.collector.reads.long_signals import auto_signals  # noqa: E402
from specwatch.collector.reads.queries import Window, signals  # noqa: E402
from specwatch.collector.tiers import aggregates  # noqa: E402

GOAL_S = 0.2
WINDOW_S = 300.0


def add_device_samples(db, start: float, end: float) -> int:
    """bench/alerts.py's device samples (loaded by path: its module name is the `alerts` package's)."""
    spec = importlib.util.spec_from_file_location("bench_alerts", REPO / "bench" / "alerts.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.add_device_samples(db, start, end)


def load(db, rows: int, batch: int, now: float) -> float:
    """Raw rows plus their aggregates, batch by batch in time order; returns seconds taken."""
    sqlite = db.dialect.name == "sqlite"
    started = time.perf_counter()
    span = WINDOW_S * batch / rows
    for first in range(0, rows, batch):
        n = min(batch, rows - first)
        t0 = now - WINDOW_S + 1e-3 + span * first / batch
        columns, data = as_tuples(generate(n, t0, min(now, t0 + span), seed=first, first=first))
        keys, totals = aggregates.aggregate(
            aggregates.columns_of_rows(data, columns), aggregates.LABELS, per_second=True
        )
        raw = db.raw_connection()
        try:
            cursor = raw.cursor()
            (_insert_sqlite if sqlite else _copy_postgres)(cursor, columns, data)
            aggregates.insert_rows(cursor, aggregates.stored_rows(keys, totals), sqlite)
            raw.commit()
        finally:
            raw.close()
    return time.perf_counter() - started


def _insert_sqlite(cursor, columns: list[str], data: list[tuple]) -> None:
    cursor.execute("BEGIN")
    cursor.executemany(insert_sql(columns), data)


def _copy_postgres(cursor, columns: list[str], data: list[tuple]) -> None:
    with cursor.copy(f"COPY requests ({', '.join(columns)}) FROM STDIN") as copy:
        for row in data:
            copy.write_row(row)


def cycle_time(db, now: float, raw: bool, repeat: int) -> float:
    runner = AlertRunner(db, load_config(), source=StoreSignals(db, raw=raw))
    step = iter(range(1, 10_000))
    seconds, _ = timed(lambda: runner.cycle(now + 1e-3 * next(step)), repeat)
    runner.close()
    return seconds


def verdict(seconds: float) -> str:
    return f"{seconds * 1000:8.1f} ms  (goal < {GOAL_S * 1000:.0f} ms: {'met' if seconds < GOAL_S else 'NOT met'})"


def run(db, now: float, repeat: int) -> None:
    with db.connect() as conn:
        in_window = conn.scalar(text("SELECT count(*) FROM requests WHERE started_at >= :t"), {"t": now - WINDOW_S})
        agg_rows = conn.scalar(text("SELECT count(*) FROM request_window_aggregates"))
    print(f"{db.dialect.name}: {in_window:,} requests in the last 5 minutes, {agg_rows:,} aggregate rows")
    agg_cycle, raw_cycle = cycle_time(db, now, False, repeat), cycle_time(db, now, True, repeat)
    print(f"  alert cycle, aggregates      {verdict(agg_cycle)}")
    print(f"  alert cycle, raw rows        {raw_cycle * 1000:8.1f} ms  ({raw_cycle / agg_cycle:.1f}x the aggregates)")
    window = Window(now - WINDOW_S, now + 1e-3)
    agg_s, agg = timed(lambda: auto_signals(db, window), repeat)
    raw_s, raw = timed(lambda: signals(db, window), max(1, repeat // 2))
    print(f"  /v1/signals 5 min, aggregates{verdict(agg_s)}")
    print(f"  /v1/signals 5 min, raw rows  {raw_s * 1000:8.1f} ms  ({raw_s / agg_s:.1f}x the aggregates)")
    print(
        f"  same counts: {agg.requests == raw.requests and agg.accepted_tokens == raw.accepted_tokens}, "
        f"stddev diff {abs(agg.acceptance_rate_stddev - raw.acceptance_rate_stddev):.1e}"
    )
    for kind in ("ttft", "e2e", "tpot"):
        got, want = getattr(agg, kind).p99, getattr(raw, kind).p99
        print(f"  {kind} P99: sketch {got:.6f} s, exact {want:.6f} s, relative error {abs(got / want - 1):.4%}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--url", help="an empty PostgreSQL database (default: a temporary SQLite file)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="specwatch-window-") as tmp:
        db = make_db(args.url or f"sqlite:///{Path(tmp) / 'bench.db'}")
        upgrade(db)
        now = time.time()
        seconds = load(db, args.rows, args.batch, now)
        print(f"loaded {args.rows:,} requests into the last 5 minutes (with their aggregates) in {seconds:.1f} s")
        print(f"adding {add_device_samples(db, now - 3600, now):,} device samples")
        if db.dialect.name == "postgresql":
            with db.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(text("ANALYZE"))
        run(db, now, args.repeat)
        db.dispose()


if __name__ == "__main__":
    main()
