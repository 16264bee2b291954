"""Retention on PostgreSQL: dropping one day's partition vs DELETE of the same number of rows.

    .venv/bin/python bench/retention.py --postgres URL [--rows 500000] [--rounds 3]

Each round starts from a fresh database at the collector's head schema (`requests` partitioned by
day, migration 0010) holding two old days of `--rows` requests each (same generator, same size,
indexes built as ingest builds them), then CHECKPOINT and VACUUM ANALYZE, and removes
  * day A through the leader's retention step, `collector.tiers.partitions.drop_before` (a count(*) and
    max(id) of the partition, to check it is rolled up, then DETACH + DROP), timed with its commit;
    the check alone is timed before it;
  * day B with `DELETE FROM requests WHERE started_at` in that day (what retention did before
    partitions, pruned to that day's partition), timed with its commit, then the `VACUUM` of that
    partition that a DELETE leaves to do (dead tuples; a dropped partition needs none).
Also the WAL each wrote (what replicas and backups must carry).
The order of the two alternates round by round. Prints per round and the medians, and each day's
partition size (pg_total_relation_size: heap, indexes, TOAST) per row.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from statistics import median

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sqlalchemy import Engine, text  # noqa: E402

from specwatch.collector.db import make_db, upgrade, write_transaction  # noqa: E402
from specwatch.collector.tiers import partitions  # noqa: E402

DAY = partitions.DAY_S
DAY_A = partitions.day_start(time.time()) - 30 * DAY  # old days: past any retention
DAY_B = DAY_A + DAY

# One realistic finished request per generated number (gamma 4, two tags), spread over the day.
FILL = """
INSERT INTO requests (request_id, instance, model, drafter, mode, mode_reason, arm, started_at, queue_s, ttft_s,
    e2e_s, prompt_tokens, output_tokens, num_drafts, num_draft_tokens, num_accepted_tokens, accepted_per_position,
    gamma, draft_s, verify_s, retries, status, error, energy_j, energy_source, load_at_admission, tags,
    draft_counts_known)
SELECT 'bench-' || :day || '-' || lpad(n::text, 8, '0'), 'gpu-' || (n % 8), 'smollm2-135m', 'ngram', 'speculative',
    'default', NULL, :day + n * (86399.0 / :rows), 0.002, 0.05 + (n % 10) / 100.0, 1.0 + (n % 7) / 10.0,
    100 + n % 50, 64, 4, 16, 13 + n % 3, CAST('[6, 4, 3, ' || (n % 3) || ']' AS json), 4, 0.01, 0.2, 0,
    'ok', NULL, NULL, NULL, 0.5, CAST('{"tenant": "acme", "scenario": "chat"}' AS json), true
FROM generate_series(1, :rows) AS n
"""


def fresh_database(url: str, rows: int) -> Engine:
    db = make_db(url)
    with db.begin() as conn:
        conn.execute(text("DROP SCHEMA public CASCADE"))
        conn.execute(text("CREATE SCHEMA public"))
    upgrade(db)
    with db.begin() as conn:
        for day in (DAY_A, DAY_B):
            partitions.create_day(conn, partitions.BY_NAME["requests"], day)
            conn.execute(text(FILL), {"day": day, "rows": rows})
    with db.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE requests"))
        conn.execute(text("CHECKPOINT"))
    return db


def rows_and_bytes(db: Engine, day: int) -> tuple[int, int]:
    name = partitions.partition_name("requests", day)
    with db.connect() as conn:
        return conn.scalar(text(f"SELECT count(*) FROM {name}")), conn.scalar(
            text("SELECT pg_total_relation_size(CAST(:name AS regclass))"), {"name": name}
        )


def wal_position(db: Engine) -> int:
    with db.connect() as conn:
        return int(conn.scalar(text("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '0/0')")))


def time_drop(db: Engine) -> tuple[float, float, int]:
    """(the rolled-up check alone, the whole retention step: check + DETACH + DROP + commit) in seconds,
    and the WAL bytes the step wrote."""
    name = partitions.partition_name("requests", DAY_A)
    with db.connect() as conn:
        start = time.perf_counter()
        conn.execute(text(f"SELECT count(*), max(id) FROM {name}")).one()
        check_s = time.perf_counter() - start
    wal, start = wal_position(db), time.perf_counter()
    with write_transaction(db) as conn:
        dropped = partitions.drop_before(conn, "requests", DAY_A + DAY, max_id=2**62)
    drop_s = time.perf_counter() - start
    assert dropped > 0 and partitions.partition_name("requests", DAY_A) not in _names(db)
    return check_s, drop_s, wal_position(db) - wal


def time_delete(db: Engine) -> tuple[float, float, int]:
    """(DELETE of day B + commit, the VACUUM of its partition after it) in seconds, and the WAL bytes
    both wrote."""
    wal, start = wal_position(db), time.perf_counter()
    with write_transaction(db) as conn:
        deleted = conn.execute(
            text("DELETE FROM requests WHERE started_at >= :lo AND started_at < :hi"), {"lo": DAY_B, "hi": DAY_B + DAY}
        ).rowcount
    delete_s = time.perf_counter() - start
    assert deleted > 0
    with db.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        start = time.perf_counter()
        conn.execute(text(f"VACUUM {partitions.partition_name('requests', DAY_B)}"))
        vacuum_s = time.perf_counter() - start
    return delete_s, vacuum_s, wal_position(db) - wal


def _names(db: Engine) -> set[str]:
    with db.connect() as conn:
        return {part.name for part in partitions.day_partitions(conn, "requests")}


def run_round(url: str, rows: int, delete_first: bool) -> dict[str, float]:
    db = fresh_database(url, rows)
    try:
        (rows_a, bytes_a), (rows_b, bytes_b) = rows_and_bytes(db, DAY_A), rows_and_bytes(db, DAY_B)
        assert rows_a == rows_b == rows
        if delete_first:
            (delete_s, vacuum_s, delete_wal), (check_s, drop_s, drop_wal) = time_delete(db), time_drop(db)
        else:
            (check_s, drop_s, drop_wal), (delete_s, vacuum_s, delete_wal) = time_drop(db), time_delete(db)
        return {
            "drop_s": drop_s,
            "check_s": check_s,
            "delete_s": delete_s,
            "vacuum_s": vacuum_s,
            "drop_wal_kb": drop_wal / 1024,
            "delete_wal_kb": delete_wal / 1024,
            "bytes_per_row": (bytes_a + bytes_b) / (rows_a + rows_b),
            "partition_mb": bytes_a / 2**20,
        }
    finally:
        db.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--postgres", default=os.environ.get("SPECWATCH_TEST_POSTGRES_URL"))
    parser.add_argument("--rows", type=int, default=500_000, help="requests in each of the two days")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if not args.postgres:
        parser.error("--postgres URL (or SPECWATCH_TEST_POSTGRES_URL) is required; the database is wiped")
    print(f"{args.rows:,} requests per day partition, {args.rounds} rounds (order alternating)")
    print("round  first   DETACH+DROP step s  (its check s)  DELETE s  VACUUM after s  DELETE/DROP  MB/partition")
    results = []
    for i in range(args.rounds):
        r = run_round(args.postgres, args.rows, delete_first=i % 2 == 1)
        results.append(r)
        first = "delete" if i % 2 else "drop"
        print(
            f"{i + 1:5d}  {first:6s}  {r['drop_s']:18.3f}  {r['check_s']:13.3f}  {r['delete_s']:8.3f}"
            f"  {r['vacuum_s']:14.3f}  {r['delete_s'] / r['drop_s']:10.1f}x  {r['partition_mb']:12.1f}"
        )
    med = {key: median(r[key] for r in results) for key in results[0]}
    print(
        f"median         {med['drop_s']:18.3f}  {med['check_s']:13.3f}  {med['delete_s']:8.3f}  {med['vacuum_s']:14.3f}"
        f"  {med['delete_s'] / med['drop_s']:10.1f}x  {med['partition_mb']:12.1f}"
    )
    print(f"WAL written: DETACH+DROP step {med['drop_wal_kb']:,.0f} kB, DELETE + VACUUM {med['delete_wal_kb']:,.0f} kB")
    print(f"stored bytes per request (partition heap + indexes + TOAST / rows): {med['bytes_per_row']:.0f}")


if __name__ == "__main__":
    main()
