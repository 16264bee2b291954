"""Requests listing over a large store: one page of GET /v1/requests' read, every sort, both orders.

    .venv/bin/python bench/requests_page.py [--rows 1000000] [--days 1] [--window 900] [--db PATH]

Fills a SQLite store with `--rows` requests over the last `--days` days (bench/query.py's loader;
`--db` keeps and reuses the file), then times `collector.reads.request_reads.list_requests` (median of
`--repeat` runs after a warm-up) over the last `--window` seconds: the slowest of the first six
pages (each read after the previous page's cursor), for each sort (time, ttft, e2e, acceptance)
descending and ascending, without filters, with an instance filter and with a status filter.
Goal: < 300 ms a page, with `--days 1` (~10,000 requests in the window) and `--days 0.01` (1M).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

from query import load, timed  # noqa: E402
from sqlalchemy import func, select  # noqa: E402

from specwatch.collector.db import make_db, upgrade  # noqa: E402
from specwatch.collector.models import Request  # noqa: E402
from specwatch.collector.reads.queries import Filters, Window  # noqa: E402
from specwatch.collector.reads.request_reads import RequestQuery, list_requests  # noqa: E402

GOAL_S = 0.3
PAGES = 6  # each listing's first pages, timed one by one
FILTERS = {"none": ({}, {}), "instance": ({"instance": "gpu-1"}, {}), "status": ({}, {"status": "error"})}


def prepare(path: Path, rows: int, days: float) -> float:
    """The store's newest start (loads it when empty)."""
    db = make_db(f"sqlite:///{path}")
    upgrade(db)
    with db.connect() as conn:
        have = conn.scalar(select(func.count()).select_from(Request))
    if not have:
        print(f"loading {rows:,} requests over {days:g} days ... {load(path, rows, days, time.time()):.1f} s")
    with db.connect() as conn:
        return float(conn.scalar(select(func.max(Request.started_at))))


def slowest_of_pages(db, window: Window, filters: Filters, q: RequestQuery, repeat: int) -> tuple[float, int]:
    """The slowest of the first `pages` pages (seconds, median of `repeat` runs each) and the rows shown."""
    slowest, cursor, rows = 0.0, None, 0
    for _ in range(PAGES):
        paged = RequestQuery(**{**q.__dict__, "cursor": cursor})
        took, page = timed(lambda paged=paged: list_requests(db, window, filters, paged), repeat)
        slowest, cursor, rows = max(slowest, took), page.next_cursor, rows + len(page.rows)
        if cursor is None:
            break
    return slowest, rows


def run(db, window: Window, repeat: int) -> float:
    worst = 0.0
    for name, (filter_args, query_args) in FILTERS.items():
        for sort in ("time", "ttft", "e2e", "acceptance"):
            for descending in (True, False):
                q = RequestQuery(sort, descending, limit=50, **query_args)
                slowest, rows = slowest_of_pages(db, window, Filters(**filter_args), q, repeat)
                worst = max(worst, slowest)
                order = "desc" if descending else "asc"
                print(f"{name:9s} {sort:10s} {order:4s} slowest of 6 pages {slowest * 1e3:7.1f} ms  rows {rows}")
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--days", type=float, default=1.0)
    parser.add_argument("--window", type=float, default=900.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--db", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="specwatch-requests-") as tmp:
        path = args.db or Path(tmp) / "bench.db"
        newest = prepare(path, args.rows, args.days)
        db = make_db(f"sqlite:///{path}")
        worst = run(db, Window(newest + 1 - args.window, newest + 1), args.repeat)
        print(
            f"slowest page {worst * 1e3:.1f} ms (goal < {GOAL_S * 1e3:.0f} ms): {'ok' if worst < GOAL_S else 'MISSED'}"
        )


if __name__ == "__main__":
    main()
