"""Dashboard first render over a large store: the Overview page with 1,000,000 stored requests.

    .venv/bin/python bench/dashboard.py [--rows 1000000] [--days 1] [--db PATH] [--repeat 3]

Fills a SQLite store with `--rows` requests over the last `--days` days (bench/query.py's
loader; `--days 1` puts ~42,000 requests in the default one-hour window), starts a real
collector on it, and times a cold first render of the Overview page (Streamlit's AppTest:
the sidebar's filter choices, every collector call the page makes, the charts), cache
cleared before each run. Also prints each collector call the page makes. Goal: < 3 s.
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

import httpx  # noqa: E402
from query import load  # noqa: E402
from sqlalchemy import func, select, update  # noqa: E402

from collector.db import make_engine, upgrade  # noqa: E402
from collector.models import Request  # noqa: E402
from collector.rollups import roll_up  # noqa: E402
from common.procs import free_port, start_collector  # noqa: E402

GOAL_S = 3.0
OVERVIEW_CALLS = [
    ("/v1/labels", {}),
    ("/v1/signals", {}),
    ("/v1/labels", {"instance": "gpu-0"}),
    ("/v1/compare", {"by": "mode"}),
    ("/v1/alerts", {}),
    ("/v1/series", {"step": 60}),
]


def prepare(path: Path, rows: int, days: float) -> None:
    engine = make_engine(f"sqlite:///{path}")
    upgrade(engine)
    with engine.connect() as conn:
        have, newest = conn.execute(select(func.count(), func.max(Request.started_at))).one()
    if not have:
        now = time.time()
        print(f"loading {rows:,} requests over {days:g} days ... {load(path, rows, days, now):.1f} s", flush=True)
        roll_up(engine, now=now)
    elif time.time() - newest > 60:  # a reused file: move its requests up to now, so the last hour is as full
        with engine.begin() as conn:
            conn.execute(update(Request).values(started_at=Request.started_at + (time.time() - newest)))
    engine.dispose()


def render_overview(url: str) -> float:
    from streamlit.testing.v1 import AppTest

    from dashboard.state import _cached

    _cached.clear()
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
                f"store: {httpx.get(f'{url}/v1/signals', params={'last': 3600}).json()['requests']:,} requests "
                f"in the last hour",
                flush=True,
            )
            for path_, params in OVERVIEW_CALLS:
                started = time.perf_counter()
                httpx.get(url + path_, params={"last": 3600, **params}, timeout=120).raise_for_status()
                print(f"  GET {path_:<16} {str(params):<18} {1000 * (time.perf_counter() - started):7.0f} ms")
            times = [render_overview(url) for _ in range(args.repeat)]
        finally:
            collector.terminate()
            collector.wait(30)
    median = statistics.median(times)
    print(
        f"Overview first render (cold cache), median of {args.repeat}: {median:.2f} s (runs: "
        f"{', '.join(f'{t:.2f}' for t in times)}); goal < {GOAL_S:.0f} s: {'met' if median < GOAL_S else 'NOT met'}"
    )


if __name__ == "__main__":
    main()
