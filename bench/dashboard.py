"""Dashboard first render over a large store: the Overview page with 1,000,000 stored requests.

    .venv/bin/python bench/dashboard.py [--rows 1000000] [--days 1] [--db PATH] [--repeat 3]

Fills a SQLite store with `--rows` requests over the last `--days` days (bench/query.py's
loader; `--days 1` puts ~42,000 requests in the default one-hour window), starts a real
collector on it, and times a cold first render of the Overview page (Streamlit's AppTest:
the sidebar's filter choices, every collector call the page makes, the charts), cache
cleared before each run. Also prints each collector call the page makes (over the dashboard's
default 15-minute window, no filters, as a first render asks them). Goal: < 1.5 s with
`--rows 1000000 --days 0.01` (1M requests inside that window; issue 24).
"""

from __future__ import annotations

import argparse
import math
import sqlite3
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

import httpx  # noqa: E402
from query import load  # noqa: E402
from sqlalchemy import func, select, update  # noqa: E402

from specwatch.collector.db import make_db, upgrade  # noqa: E402
from specwatch.collector.models import Request  # noqa: E402
from specwatch.collector.tiers import aggregates  # noqa: E402
from specwatch.collector.tiers.rollups import roll_up  # noqa: E402
from specwatch.common.procs import free_port, start_collector  # noqa: E402

GOAL_S = 1.5
WINDOW_S = 900  # the dashboard's default window (dashboard.api.View.seconds)
# what a first render of the Overview asks, in order: the sidebar's filter choices, then the page
# (services.overview asks /v1/labels again, with the view's filters: none on a first render)
OVERVIEW_CALLS = [
    ("/v1/labels", {}),
    ("/v1/labels", {}),
    ("/v1/alerts", {"include_resolved": "true"}),
    ("/v1/signals", {}),
    ("/v1/compare", {"by": "mode"}),
    ("/v1/series", {"step": 60}),
]
# the other pages' query calls over requests (each timed once, not rendered)
PAGE_CALLS = [
    ("/v1/compare", {"by": "arm"}),
    ("/v1/breakdown", {"by": "drafter"}),
    ("/v1/breakdown", {"by": "mode"}),
    ("/v1/breakdown", {"by": "tag:scenario"}),
    ("/v1/acceptance/positions", {}),
    ("/v1/acceptance/length", {"by": "prompt_tokens"}),
    ("/v1/throughput/by-load", {}),
    ("/v1/errors/by-hour", {}),
    ("/v1/sources", {}),
]


def prepare(path: Path, rows: int, days: float) -> None:
    db = make_db(f"sqlite:///{path}")
    upgrade(db)
    with db.connect() as conn:
        have, newest = conn.execute(select(func.count(), func.max(Request.started_at))).one()
    if not have:
        now = time.time()
        print(f"loading {rows:,} requests over {days:g} days ... {load(path, rows, days, now):.1f} s", flush=True)
        started = time.perf_counter()
        written = write_aggregates(path)
        print(f"per-second aggregates as ingest writes them: {written:,} rows, {time.perf_counter() - started:.1f} s")
        roll_up(db, now=now)
    elif time.time() - newest > 60:  # a reused file: move its requests (and aggregates) up to now
        shift = math.floor(time.time() - newest)
        with db.begin() as conn:
            conn.execute(update(Request).values(started_at=Request.started_at + shift))
            agg = aggregates.WindowAggregate
            conn.execute(update(agg).values(period_start=agg.period_start + shift))
    db.dispose()


def write_aggregates(path: Path) -> int:
    """The per-second aggregates ingest writes for these requests (bench/query.py's loader writes raw
    rows only; without them every window read would find the covered seconds empty)."""
    with sqlite3.connect(path) as conn:
        rows = conn.execute(f"SELECT {', '.join(aggregates.SOURCE_FIELDS)} FROM requests").fetchall()
        keys, totals = aggregates.aggregate(
            aggregates.columns_of_rows(rows, aggregates.SOURCE_FIELDS), aggregates.LABELS, per_second=True
        )
        stored = aggregates.stored_rows(keys, totals)
        aggregates.insert_rows(conn.cursor(), stored, sqlite=True)
    return len(stored)


def timed_get(url: str, path: str, params: dict) -> None:
    started = time.perf_counter()
    response = httpx.get(url + path, params={"last": WINDOW_S, **params}, timeout=120)
    response.raise_for_status()
    sampled = response.json().get("sampled") if isinstance(response.json(), dict) else None
    note = f"  (sampled: {sampled['rows']:,} of {sampled['of']:,})" if sampled else ""
    print(f"  GET {path:<26} {str(params):<24} {1000 * (time.perf_counter() - started):7.0f} ms{note}", flush=True)


def render_overview(url: str) -> float:
    from streamlit.testing.v1 import AppTest

    from specwatch.dashboard.state import clear_cache

    clear_cache()
    started = time.perf_counter()
    app = AppTest.from_file(str(REPO / "dashboard" / "app.py"), default_timeout=120).run()
    seconds = time.perf_counter() - started
    if app.exception or app.error:
        raise SystemExit(f"the Overview failed: {[e.value for e in app.exception or app.error]}")
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--days", type=float, default=1.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--db", type=Path, help="SQLite file to create (or reuse if it exists)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="specwatch-dashboard-") as tmp:
        path = args.db or Path(tmp) / "bench.db"
        prepare(path, args.rows, args.days)
        port = free_port()
        collector = start_collector(port, Path(tmp) / "collector.log", f"sqlite:///{path}")
        url = f"http://127.0.0.1:{port}"
        try:
            import os

            os.environ["SPECWATCH_COLLECTOR_URL"] = url
            print(
                f"store: {httpx.get(f'{url}/v1/signals', params={'last': WINDOW_S}).json()['requests']:,} requests "
                f"in the last {WINDOW_S} s",
                flush=True,
            )
            print("the Overview's calls:")
            for path_, params in OVERVIEW_CALLS:
                timed_get(url, path_, params)
            print("other pages' calls:")
            for path_, params in PAGE_CALLS:
                timed_get(url, path_, params)
            times = [render_overview(url) for _ in range(args.repeat)]
        finally:
            collector.terminate()
            collector.wait(30)
    median = statistics.median(times)
    print(
        f"Overview first render (cold cache), median of {args.repeat}: {median:.2f} s (runs: "
        f"{', '.join(f'{t:.2f}' for t in times)}); goal < {GOAL_S:g} s: {'met' if median < GOAL_S else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
