"""Ingest throughput: HTTP ingest through the collector vs raw sqlite3.executemany of the same rows.

    .venv/bin/python bench/ingest.py [--rows 20000] [--batch 1000] [--postgres URL]

Prints, measured side by side in one run on fresh databases with the collector's own schema (indexes
and unique keys included) and the service's durability settings (WAL, synchronous=FULL,
one transaction per batch):
  * raw `sqlite3.executemany` rows/s (tuples prepared before the clock starts),
  * records/s through `specwatch collector serve` over HTTP (pre-serialised JSON bodies of
    `--batch` records; 1 and 4 concurrent client processes),
  * their ratio (goal: >= 0.3x): each HTTP run against the raw runs just before and after it,
    median over `--rounds` rounds (see `measure_backend`).
With --postgres (or SPECWATCH_TEST_POSTGRES_URL) the same for PostgreSQL, against raw
psycopg `executemany`. The collector runs as a subprocess on this machine, with its default
ingest worker processes (SPECWATCH_INGEST_PROCESSES, 2), so clients and server share its cores.

    .venv/bin/python bench/ingest.py --latency-only [--clients 4] [--rows 400000] [--maintenance-interval 10]

measures only the latency of each POST from `--clients` producers (p50, p99, max; a 503 is retried as the
producer client does, its wait counted) over a run long enough for the collector's roll-ups to run
under load (each pass holds the SQLite write lock while it folds a chunk of raw rows).

    .venv/bin/python bench/ingest.py --postgres URL --replicas 1,2 [--clients 4]

measures only replicas (docs/scaling.md): records/s through 1, 2, ... collector processes on one
PostgreSQL, the same `--clients` producer processes spread round-robin over them, alternating
the replica counts round by round; with the CPU seconds per 1,000 records spent by the
collectors, PostgreSQL and the producers (from /proc), how busy the machine was, and the bytes
per stored request (pg_total_relation_size of `requests` / its rows, indexes and TOAST included).
"""

from __future__ import annotations

import argparse
import contextlib
import math
import multiprocessing
import os
import sqlite3
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402
import orjson  # noqa: E402

from specwatch.collector.db import make_db, upgrade  # noqa: E402
from specwatch.collector.ingest.store import REQUESTS  # noqa: E402
from specwatch.common import procs as children  # noqa: E402
from specwatch.telemetry.schema import RequestRecord  # noqa: E402

T0 = time.time() - 3600.0  # recent, so the collector's retention keeps it


def payloads(n: int, prefix: str) -> list[dict]:
    """Realistic finished-request records (speculative, gamma 4, two tags)."""
    out = []
    for i in range(n):
        per_pos = [6, 4, 3, i % 3]
        out.append(
            {
                "request_id": f"{prefix}-{i:08d}",
                "instance": f"gpu-{i % 4}",
                "model": "smollm2-135m",
                "drafter": "ngram",
                "mode": "speculative",
                "mode_reason": "default",
                "started_at": T0 + i * 0.01,
                "queue_s": 0.002,
                "ttft_s": 0.04 + (i % 50) / 1000,
                "e2e_s": 1.2 + (i % 90) / 100,
                "prompt_tokens": 200 + i % 300,
                "output_tokens": 128,
                "num_drafts": 8,
                "num_draft_tokens": 32,
                "num_accepted_tokens": sum(per_pos),
                "accepted_per_position": per_pos,
                "gamma": 4,
                "draft_s": 0.1,
                "verify_s": 0.9,
                "retries": 0,
                "status": "ok",
                "energy_j": 12.5,
                "energy_source": "rapl",
                "load_at_admission": 0.4,
                "tags": {"tenant": f"t{i % 7}", "scenario": "bench"},
            }
        )
    return out


def fresh_sqlite(directory: Path, name: str) -> Path:
    path = directory / name
    db = make_db(f"sqlite:///{path}")
    upgrade(db)
    db.dispose()
    return path


def raw_sqlite_rate(path: Path, rows: list[dict], batch: int) -> float:
    records = [RequestRecord.model_validate(r) for r in rows]
    tuples = REQUESTS.rows(records, lambda v: orjson.dumps(v).decode())
    conn = sqlite3.connect(path, isolation_level=None)
    for pragma in ("journal_mode=WAL", "synchronous=FULL"):
        conn.execute(f"PRAGMA {pragma}")
    sql = f"INSERT INTO requests ({', '.join(REQUESTS.columns)}) VALUES ({', '.join('?' * len(REQUESTS.columns))})"
    started = time.perf_counter()
    for i in range(0, len(tuples), batch):
        conn.execute("BEGIN")
        conn.executemany(sql, tuples[i : i + batch])
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - started
    conn.close()
    return len(tuples) / elapsed


def raw_postgres_rate(url: str, rows: list[dict], batch: int) -> float:
    import psycopg
    from psycopg.types.json import Json

    records = [RequestRecord.model_validate(r) for r in rows]
    tuples = REQUESTS.rows(records, Json)
    dsn = url.replace("postgresql+psycopg://", "postgresql://")
    sql = f"INSERT INTO requests ({', '.join(REQUESTS.columns)}) VALUES ({', '.join(['%s'] * len(REQUESTS.columns))})"
    with psycopg.connect(dsn) as conn:
        started = time.perf_counter()
        for i in range(0, len(tuples), batch):
            with conn.transaction(), conn.cursor() as cur:
                cur.executemany(sql, tuples[i : i + batch])
        elapsed = time.perf_counter() - started
    return len(tuples) / elapsed


def reset_postgres(url: str) -> None:
    from sqlalchemy import text

    db = make_db(url)
    with db.begin() as conn:
        conn.execute(text("DROP SCHEMA public CASCADE"))
        conn.execute(text("CREATE SCHEMA public"))
    upgrade(db)
    db.dispose()


def http_rate(url: str | list[str], bodies: list[bytes], per_body: int, clients: int) -> float:
    """Records/s with `clients` client processes (producers are separate processes, e.g. one
    engine each), each posting its share of the bodies back to back; the clock runs from
    when all are connected and released together until the last one is done. Several URLs
    (replicas): client i posts to URL i mod their number. Each POST's latency goes to `LATENCIES`."""
    urls = [url] if isinstance(url, str) else url
    context = multiprocessing.get_context("fork")  # the bodies are inherited, not copied through a pipe
    ready, errors, timings = context.Barrier(clients + 1), context.Queue(), context.Queue()
    processes = [
        context.Process(
            target=_post_all, args=(urls[i % len(urls)], bodies[i::clients], per_body, ready, (errors, timings))
        )
        for i in range(clients)
    ]
    for process in processes:
        process.start()
    ready.wait(timeout=60)
    started = time.perf_counter()
    LATENCIES.setdefault(clients, []).extend(timings.get(timeout=600) for _ in processes)
    for process in processes:
        process.join()
    elapsed = time.perf_counter() - started
    failures = []
    while not errors.empty():  # (Queue.qsize is not implemented on macOS)
        failures.append(errors.get())
    if failures or any(p.exitcode for p in processes):
        raise SystemExit(f"ingest failed: {failures[0] if failures else 'a client process exited with an error'}")
    return per_body * len(bodies) / elapsed


# {clients: [one list per client process of (seconds since its start, latency s, 503s retried)]}
LATENCIES: dict[int, list[list[tuple[float, float, int]]]] = {}


def _post_all(url: str, share: list[bytes], per_body: int, ready, queues) -> None:
    """Post each body as a producer would: a 503 (the store was busy) is retried after 0.1 s, and the
    latency counts from the first try to the 200."""
    errors, timings = queues
    spent = []
    with httpx.Client(timeout=60, headers={"content-type": "application/json"}) as http:
        http.get(f"{url}/healthz")  # connect before the clock starts
        ready.wait(timeout=60)
        started = time.perf_counter()
        for body in share:
            sent, retried = time.perf_counter(), 0
            while (response := http.post(f"{url}/v1/ingest", content=body)).status_code == 503 and retried < 50:
                retried += 1
                time.sleep(0.1)
            spent.append((sent - started, time.perf_counter() - sent, retried))
            if response.status_code != 200 or response.json()["accepted"] != per_body:
                errors.put(f"{response.status_code} {response.text[:200]}")
                break
    timings.put(spent)


def latency_line(clients: int) -> str:
    """p50, p99 and max of the POST latencies of `clients` producers over every round, the 503s retried,
    and when the slowest POST was sent (seconds into its client's run)."""
    runs = LATENCIES.get(clients, [])
    flat = sorted((lat, at, retried) for run in runs for at, lat, retried in run)
    if not flat:
        return f"{clients_label(clients)}: no POST timed"
    lats = [lat for lat, *_ in flat]
    p99 = lats[min(len(lats) - 1, math.ceil(0.99 * len(lats)) - 1)]
    slowest = flat[-1]
    return (
        f"ingest POST latency, {clients_label(clients)} ({len(lats)} POSTs): p50 {1000 * median(lats):.0f} ms, "
        f"p99 {1000 * p99:.0f} ms, max {1000 * slowest[0]:.0f} ms (sent {slowest[1]:.1f} s into its run); "
        f"503s retried: {sum(r for *_, r in flat)}"
    )


def producer_cost_us(port: int, n: int = 20_000) -> float:
    """What a producer (the engine) pays per submitted record while the client ships them."""
    from specwatch.telemetry.client import TelemetryClient

    records = [RequestRecord.model_validate(r) for r in payloads(n, "producer")]
    client = TelemetryClient(f"http://127.0.0.1:{port}", batch_size=1000, flush_interval_s=0.05)
    started = time.perf_counter()
    for record in records:
        client.submit_request(record)
    elapsed = time.perf_counter() - started
    client.flush(60.0)
    client.close()
    if client.stats().delivered != n:
        raise SystemExit(f"client delivered {client.stats()}")
    return elapsed / n * 1e6


def bodies_for(n: int, batch: int, prefix: str) -> list[bytes]:
    rows = payloads(n, prefix)
    return [orjson.dumps({"requests": rows[i : i + batch]}) for i in range(0, n, batch)]


def measure_backend(name: str, fresh_db, raw_rate, args, workdir: Path, port: int) -> list[tuple[str, float, float]]:
    """`--rounds` rounds of raw, HTTP 1 client, raw, HTTP 4 clients, raw.

    This machine's speed drifts by up to 2x within minutes, so each HTTP figure is divided by
    the mean of the raw figures measured just before and just after it, and the median of those
    per-round ratios is reported (with the median rates). Every measurement starts from an empty
    database (`fresh_db(label)` returns its URL): inserts slow down by ~30% as the tables and
    their indexes grow, so a shared, growing database would favour whichever side ran first.
    """
    raws, rates, ratios = [], {1: [], 4: []}, {1: [], 4: []}
    for round_no in range(args.rounds):
        before = raw_rate(fresh_db(f"raw-{round_no}-a"))
        raws.append(before)
        for clients in (1, 4):
            bodies = bodies_for(args.rows, args.batch, f"{name}-r{round_no}-c{clients}")
            with running_collector(
                fresh_db(f"served-{round_no}-c{clients}"), port, workdir / f"collector-{name}.log"
            ) as url:
                rate = http_rate(url, bodies, args.batch, clients)
            after = raw_rate(fresh_db(f"raw-{round_no}-c{clients}"))
            raws.append(after)
            rates[clients].append(rate)
            ratios[clients].append(rate / ((before + after) / 2))
            before = after
        print(
            f"  round {round_no + 1}: " + ", ".join(f"{clients_label(c)} {ratios[c][-1]:.2f}x" for c in (1, 4)),
            flush=True,
        )
    if name == "sqlite":
        with running_collector(fresh_db("producer"), port, workdir / f"collector-{name}.log"):
            print(f"TelemetryClient.submit_request on the producer thread: {producer_cost_us(port):.1f} us per record")
    return [(f"{name}: raw executemany", median(raws), 1.0)] + [
        (f"{name}: HTTP ingest, {clients_label(c)}", median(rates[c]), median(ratios[c])) for c in (1, 4)
    ]


def clients_label(n: int) -> str:
    return f"{n} client{'s' if n > 1 else ''}"


COLLECTOR_ENV: dict[str, str] = {}  # e.g. SPECWATCH_MAINTENANCE_INTERVAL_S (--maintenance-interval)


@contextlib.contextmanager
def running_collector(db_url: str, port: int, log: Path):
    try:
        proc = children.start_collector(port, log, db_url=db_url, env=COLLECTOR_ENV)
    except children.StartError as exc:
        raise SystemExit(str(exc)) from None
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


def measure_latency(args) -> None:
    """--latency-only: `--rounds` runs of `--rows` records from `--clients` producers into a fresh
    collector each; the POST latencies over all of them, with the load average."""
    with tempfile.TemporaryDirectory(prefix="specwatch-bench-") as tmp:
        for round_no in range(args.rounds):
            url = f"sqlite:///{fresh_sqlite(Path(tmp), f'latency-{round_no}.db')}"
            bodies = bodies_for(args.rows, args.batch, f"latency-r{round_no}")
            with running_collector(url, args.port, Path(tmp) / "collector.log") as collector:
                rate = http_rate(collector, bodies, args.batch, args.clients)
            print(f"  round {round_no + 1}: {rate:,.0f} records/s", flush=True)
    print(f"{args.rows} request records per run, batches of {args.batch}, {args.clients} producers, {COLLECTOR_ENV}")
    print(latency_line(args.clients))
    print("load average (1, 5, 15 min) at the end: " + ", ".join(f"{v:.2f}" for v in os.getloadavg()))


CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def _proc_stat(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return []


def _cpu_s(pids) -> float:
    """User + system CPU seconds of these processes so far (Linux /proc; a gone process counts 0)."""
    return sum((int(f[11]) + int(f[12])) / CLOCK_TICKS for f in map(_proc_stat, pids) if f)


def _pids(where) -> list[int]:
    return [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and where(int(p.name))]


def _postgres_pids() -> list[int]:
    def is_postgres(pid: int) -> bool:
        try:
            return Path(f"/proc/{pid}/comm").read_text().strip() == "postgres"
        except OSError:
            return False

    return _pids(is_postgres)


def _with_children(pids: list[int]) -> list[int]:
    return pids + _pids(lambda pid: (f := _proc_stat(pid)) != [] and int(f[1]) in pids)


def _machine_busy_s() -> tuple[float, float]:
    """(busy, total) CPU seconds of the whole machine so far, all cores (/proc/stat)."""
    fields = [int(v) / CLOCK_TICKS for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle + iowait
    return sum(fields) - idle, sum(fields)


@contextlib.contextmanager
def running_replicas(db_url: str, n: int, first_port: int, workdir: Path):
    """n collectors on one database, started one after the other (each migrates or finds the schema
    current); yields (their URLs, their pids)."""
    procs = []
    try:
        for i in range(n):
            log = workdir / f"replica-{i}.log"
            env = {"SPECWATCH_REPLICA_ID": f"bench-{i}"}
            cmd = children.specwatch_command("collector", "serve", "--port", str(first_port + i), "--db", db_url)
            ready = f"http://127.0.0.1:{first_port + i}/readyz"
            procs.append(children.start_service("collector", cmd, children.child_env(env), log, ready, 60))
        yield [f"http://127.0.0.1:{first_port + i}" for i in range(n)], [p.pid for p in procs]
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(10)


def measure_replicas(url: str, counts: list[int], args, workdir: Path) -> None:
    """Records/s through each replica count, `--rounds` rounds alternating the counts (medians
    reported), with where the CPU went; then the bytes per stored request."""
    rates: dict[int, list[float]] = {n: [] for n in counts}
    cpu: dict[int, list[dict[str, float]]] = {n: [] for n in counts}
    for round_no in range(args.rounds):
        for n in counts if round_no % 2 == 0 else counts[::-1]:
            reset_postgres(url)
            bodies = bodies_for(args.rows, args.batch, f"replicas-r{round_no}-n{n}")
            with running_replicas(url, n, args.port, workdir) as (urls, pids):
                rate, spent = _timed_run(urls, pids, bodies, args)
            rates[n].append(rate)
            cpu[n].append(spent)
            print(f"  round {round_no + 1}, {n} replica(s): {rate:,.0f} records/s", flush=True)
    print(f"replicas: {args.rows} request records per run, batches of {args.batch}, {args.clients} client processes")
    print("CPU seconds per 1,000 records in the collectors (with their ingest workers), PostgreSQL, the clients")
    print(f"{'replicas':>8} {'records/s':>10} {'collectors':>10} {'postgres':>9} {'clients':>8}  machine busy")
    for n in counts:
        share = {k: median(s[k] for s in cpu[n]) for k in cpu[n][0]}
        per_k = {k: share[k] / args.rows * 1000 for k in ("collectors", "postgres", "clients")}
        print(
            f"{n:>8} {median(rates[n]):>10,.0f} {per_k['collectors']:>10.3f} {per_k['postgres']:>9.3f} "
            f"{per_k['clients']:>8.3f}  {share['busy']:.0%} of {os.cpu_count()} cores"
        )
    _print_bytes_per_record(url)


def _timed_run(urls: list[str], pids: list[int], bodies: list[bytes], args) -> tuple[float, dict[str, float]]:
    collectors, postgres = _with_children(pids), _postgres_pids()
    before = (_cpu_s(collectors), _cpu_s(postgres), os.times(), _machine_busy_s())
    started = time.perf_counter()
    rate = http_rate(urls, bodies, args.batch, args.clients)
    wall = time.perf_counter() - started
    postgres_now = _postgres_pids()  # backends started during the run count from 0
    after = (_cpu_s(collectors), _cpu_s(postgres_now), os.times(), _machine_busy_s())
    clients = (after[2].children_user + after[2].children_system) - (
        before[2].children_user + before[2].children_system
    )
    busy, total = after[3][0] - before[3][0], after[3][1] - before[3][1]
    spent = {"collectors": after[0] - before[0], "postgres": after[1] - before[1], "clients": clients}
    return rate, {**spent, "busy": busy / total if total else 0.0, "wall": wall}


def _print_bytes_per_record(url: str) -> None:
    from sqlalchemy import text

    db = make_db(url)
    with db.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("VACUUM ANALYZE requests"))
        rows = conn.scalar(text("SELECT count(*) FROM requests"))
        total, table = conn.execute(
            text("SELECT pg_total_relation_size('requests'), pg_relation_size('requests')")
        ).one()
    db.dispose()
    print(
        f"bytes per stored request (last run, {rows:,} rows): {total / rows:,.0f} with indexes and TOAST "
        f"({table / rows:,.0f} heap only)"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--port", type=int, default=18087)
    parser.add_argument("--rounds", type=int, default=5, help="rounds; the median of the per-round ratios is reported")
    parser.add_argument(
        "--postgres",
        default=os.environ.get("SPECWATCH_TEST_POSTGRES_URL"),
        help="PostgreSQL URL (its public schema is dropped and recreated!)",
    )
    parser.add_argument(
        "--replicas", help="comma-separated replica counts, e.g. 1,2: measure only those (needs --postgres)"
    )
    parser.add_argument(
        "--clients", type=int, default=4, help="client processes for --replicas and --latency-only (default 4)"
    )
    parser.add_argument(
        "--latency-only",
        action="store_true",
        help="only HTTP ingest on SQLite from --clients producers, --rounds runs of --rows: POST latencies, no ratios",
    )
    parser.add_argument(
        "--maintenance-interval",
        type=float,
        help="the collector's SPECWATCH_MAINTENANCE_INTERVAL_S (default its 60 s: a short run never sees a roll-up)",
    )
    args = parser.parse_args()
    if args.maintenance_interval:
        COLLECTOR_ENV["SPECWATCH_MAINTENANCE_INTERVAL_S"] = str(args.maintenance_interval)
    if args.latency_only:
        measure_latency(args)
        return
    if args.replicas:
        if not args.postgres:
            parser.error("--replicas needs --postgres (or SPECWATCH_TEST_POSTGRES_URL)")
        with tempfile.TemporaryDirectory(prefix="specwatch-bench-") as tmp:
            measure_replicas(args.postgres, [int(n) for n in args.replicas.split(",")], args, Path(tmp))
        return
    results = []
    with tempfile.TemporaryDirectory(prefix="specwatch-bench-") as tmp:
        workdir = Path(tmp)
        rows = payloads(args.rows, "raw")

        def fresh_sqlite_url(label: str) -> str:
            return f"sqlite:///{fresh_sqlite(workdir, f'{label}.db')}"

        def raw_sqlite(url: str) -> float:
            return raw_sqlite_rate(Path(url.removeprefix("sqlite:///")), rows, args.batch)

        results += measure_backend("sqlite", fresh_sqlite_url, raw_sqlite, args, workdir, args.port)
        if args.postgres:

            def fresh_postgres(label: str) -> str:
                reset_postgres(args.postgres)
                return args.postgres

            def raw_postgres(url: str) -> float:
                return raw_postgres_rate(url, rows, args.batch)

            results += measure_backend("postgresql", fresh_postgres, raw_postgres, args, workdir, args.port)
    print(
        f"{args.rows} request records per run, batches of {args.batch}; medians of {args.rounds} rounds "
        "(each ratio against the raw runs just before and after it)"
    )
    print(f"{'what':<36} {'records/s':>11} {'vs raw':>8}")
    for what, rate, ratio in results:
        print(f"{what:<36} {rate:>11,.0f} {ratio:>7.2f}x")
    verdicts = [
        f"{what.removeprefix('sqlite: HTTP ingest, ')} {ratio:.2f}x ({'met' if ratio >= 0.3 else 'NOT met'})"
        for what, _, ratio in results
        if what.startswith("sqlite: HTTP")
    ]
    print(f"goal: SQLite HTTP ingest >= 0.30x raw executemany -> {', '.join(verdicts)}")
    for clients in sorted(LATENCIES):
        print(latency_line(clients))
    print(
        "goal: ingest p99 <= 300 ms and max <= 2 s with 4 producers; load average (1, 5, 15 min) at the end: "
        + ", ".join(f"{v:.2f}" for v in os.getloadavg())
    )


if __name__ == "__main__":
    main()
