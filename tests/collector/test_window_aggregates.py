"""Window aggregates: DDSketch accuracy and merging, idempotent ingest, and signals from
aggregates equal to signals from raw rows (SQLite and PostgreSQL), coverage fallback included."""

from __future__ import annotations

import math

import numpy as np
import pytest
from collector_payloads import T0, request_dict
from ddsketch import DDSketch
from sqlalchemy import event, func, insert, select

from specwatch.alerts.rules import load_config
from specwatch.alerts.runner import AlertRunner
from specwatch.alerts.signals import SIGNALS, StoreSignals
from specwatch.collector.db import make_db, upgrade
from specwatch.collector.ingest.store import REQUESTS, Store
from specwatch.collector.models import Request
from specwatch.collector.reads import window_signals
from specwatch.collector.reads.queries import Filters, Window, signals
from specwatch.collector.tiers import aggregates, sketch
from specwatch.collector.tiers.aggregates import WindowAggregate
from specwatch.telemetry.schema import IngestBatch, RequestRecord

QUANTILES = (0.5, 0.9, 0.95, 0.99)
REQUEST_SIGNALS = {name for name, signal in SIGNALS.items() if signal.aggregated is not None}


def distributions(n: int = 20_000) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    return {
        "lognormal": rng.lognormal(mean=-2.0, sigma=0.8, size=n),
        # a fast path and a slow one (cache hit vs cold prefill)
        "bimodal": np.concatenate([rng.normal(0.05, 0.01, n // 2).clip(1e-4), rng.normal(0.8, 0.1, n // 2)]),
        "pareto": (rng.pareto(1.5, size=n) + 1) * 0.02,  # heavy tail
    }


@pytest.mark.parametrize("name", ["lognormal", "bimodal", "pareto"])
def test_sketch_quantiles_are_within_one_percent_of_exact(name):
    values = distributions()[name]
    bins = sketch.decode(sketch.encode(sketch.from_values(values)))
    for q in QUANTILES:
        assert sketch.quantile(bins, q) == pytest.approx(np.quantile(values, q), rel=sketch.RELATIVE_ACCURACY)


def test_rank_values_and_keys_are_the_ddsketch_package_s():
    values = distributions()["lognormal"][:5000]
    reference = DDSketch(sketch.RELATIVE_ACCURACY)
    for v in values:
        reference.add(float(v))
    bins = sketch.from_values(values)
    assert sketch.keys(values).tolist() == [sketch.MAPPING.key(float(v)) for v in values]
    for q in QUANTILES:
        rank = int(q * (len(values) - 1))
        assert sketch.value_at_rank(bins, rank) == reference.get_quantile_value(rank / (len(values) - 1))


def test_merged_sketches_equal_the_sketch_of_the_union():
    values = np.concatenate([*distributions(4000).values(), np.zeros(7)])
    rng = np.random.default_rng(1)
    pieces = np.array_split(rng.permutation(values), 60)  # e.g. 60 seconds x label sets
    merged = sketch.merge(sketch.decode(sketch.encode(sketch.from_values(p))) for p in pieces)
    whole = sketch.from_values(values)
    assert (merged.zeros, merged.min_key, merged.counts.tolist()) == (whole.zeros, whole.min_key, whole.counts.tolist())


def test_encoding_widens_with_the_largest_count():
    many = sketch.from_values(np.full(70_000, 0.1))
    assert len(sketch.encode(many)) == 18 + 4 and sketch.decode(sketch.encode(many)).count == 70_000
    assert sketch.encode(sketch.EMPTY) is None and sketch.decode(None).count == 0


def test_merging_stored_sketches_by_group_equals_merging_each_group_s_decoded_pieces():
    rng = np.random.default_rng(2)
    values = [rng.lognormal(-2.0, 1.0, int(rng.integers(1, 400))) for _ in range(200)]
    values += [np.full(70_000, 0.1), np.zeros(5), np.concatenate([np.zeros(3), [0.2, 4.0]])]  # 4-byte counts, zeros
    blobs = [sketch.encode(sketch.from_values(v)) for v in values] + [None]
    group = rng.integers(0, 6, len(blobs))  # group 6 of 7 gets nothing
    merged = sketch.merge_encoded(blobs, group, 7)
    for g, got in enumerate(merged):
        want = sketch.merge(sketch.decode(b) for b, in_group in zip(blobs, group) if in_group == g)
        assert (got.zeros, got.min_key, got.counts.tolist()) == (want.zeros, want.min_key, want.counts.tolist())
    assert merged[6] == sketch.EMPTY and sketch.merge_encoded([None], np.array([0]), 1) == [sketch.EMPTY]
    (zeros_only,) = sketch.merge_encoded([sketch.encode(sketch.from_values(np.zeros(4)))] * 2, np.array([0, 0]), 1)
    assert (zeros_only.zeros, zeros_only.counts.size) == (8, 0)


def workload(n: int = 3000, start: float = T0, span_s: float = 200.0, seed: int = 5, first_id: int = 0) -> list[dict]:
    """Requests over several label sets: spec and plain, A/B arms, errors and OOMs, missing TTFT."""
    rng = np.random.default_rng(seed)
    records = []
    for i in range(n):
        spec = rng.random() < 0.7
        drafts = int(rng.integers(1, 12)) if spec else 0
        accepted = int(rng.binomial(4 * drafts, rng.beta(5, 3))) if spec else 0
        per_pos = [sum(1 for d in range(drafts) if min(4, max(0, accepted - 4 * d)) > k) for k in range(4)]
        error = rng.random() < 0.03
        overrides = dict(
            instance=f"gpu-{i % 3}",
            arm=["spec", "control"][(i // 5) % 2] if i % 5 == 0 else None,
            started_at=start + float(rng.uniform(0, span_s)),
            ttft_s=None if rng.random() < 0.02 else float(rng.lognormal(-2.5, 0.6)),
            e2e_s=float(rng.lognormal(0.0, 0.5)),
            output_tokens=int(rng.integers(1, 300)),
            status="error" if error else "ok",
            error=("target:oom" if rng.random() < 0.5 else "timeout") if error else None,
            device_s=float(rng.uniform(0.1, 1.0)) if rng.random() < 0.8 else None,
        )
        overrides["device_s_source"] = None if overrides["device_s"] is None else "engine"
        if spec:
            overrides |= dict(num_drafts=drafts, num_draft_tokens=4 * drafts, num_accepted_tokens=accepted)
            overrides |= dict(accepted_per_position=per_pos)
        else:
            overrides |= dict(mode="autoregressive", drafter=None, num_drafts=0, num_draft_tokens=0)
            overrides |= dict(num_accepted_tokens=0, accepted_per_position=[], gamma=0)
        records.append(request_dict(first_id + i, **overrides))
    return records


def store_in_batches(db, records: list[dict], batches: int = 5) -> Store:
    store = Store(db)
    for chunk in np.array_split(np.arange(len(records)), batches):
        store.insert(IngestBatch.model_validate({"requests": [records[i] for i in chunk]}))
    return store


def aggregate_sums(db) -> tuple:
    columns = ("requests", "draft_tokens", "accepted_tokens", "rate_n", "rate_sum")
    with db.connect() as conn:
        return tuple(conn.execute(select(*(func.sum(getattr(WindowAggregate, c)) for c in columns))).one())


def test_a_resent_batch_is_not_aggregated_twice(db):
    records = workload(400)
    store = store_in_batches(db, records, batches=2)
    once = aggregate_sums(db)
    store.insert(IngestBatch.model_validate({"requests": records[:300]}))  # a duplicate batch
    store.insert(IngestBatch.model_validate({"requests": records[350:]}))
    assert aggregate_sums(db) == once and once[0] == 400
    fresh = [request_dict(10_000 + i, started_at=T0 + 50 + i) for i in range(5)]
    store.insert(IngestBatch.model_validate({"requests": records[:50] + fresh}))  # partly new
    assert aggregate_sums(db)[0] == 405


def assert_same_signals(db, window: Window, filters: Filters = Filters()) -> None:
    raw, agg = signals(db, window, filters), window_signals.signals(db, window, filters)
    exact = ("requests", "errors", "ooms", "drafts", "draft_tokens", "accepted_tokens", "acceptance_rate")
    assert [getattr(agg, f) for f in exact] == [getattr(raw, f) for f in exact]
    assert agg.requests > 0
    assert agg.output_tokens_per_s == pytest.approx(raw.output_tokens_per_s, rel=1e-12)
    assert agg.acceptance_rate_mean == pytest.approx(raw.acceptance_rate_mean, abs=1e-9)
    assert agg.acceptance_rate_stddev == pytest.approx(raw.acceptance_rate_stddev, abs=1e-9)
    for kind in ("ttft", "e2e", "tpot"):
        got, want = getattr(agg, kind), getattr(raw, kind)
        assert got.count == want.count
        for q in ("p50", "p90", "p95", "p99"):
            assert getattr(got, q) == pytest.approx(getattr(want, q), rel=sketch.RELATIVE_ACCURACY)


def assert_same_alert_signals(db, now: float, window_s: float) -> None:
    aggregated, raw = StoreSignals(db), StoreSignals(db, raw=True)
    for name, group_by in [
        ("acceptance_rate", ["instance", "mode"]),
        ("acceptance_stddev", ["instance"]),
        ("ttft_p99", ["instance", "arm"]),
        ("spec_cost_excess", ["instance"]),
        ("oom_count", ["instance"]),
        ("spec_latency_regression", ["instance"]),
    ]:
        got = {s.labels: s for s in aggregated.query(name, window_s, group_by, now)}
        want = {s.labels: s for s in raw.query(name, window_s, group_by, now)}
        assert got.keys() == want.keys() and want, name
        for key, sample in want.items():
            assert got[key].count == sample.count, (name, key)
            tolerance = dict(rel=0.01) if name == "ttft_p99" else dict(abs=1e-9)
            assert got[key].value == pytest.approx(sample.value, **tolerance), (name, key)


def test_signals_from_aggregates_equal_signals_from_raw_rows(db):
    store_in_batches(db, workload())
    for window in (Window(T0 + 10.37, T0 + 170.81), Window(T0 - 5, T0 + 300), Window(T0 + 20, T0 + 80)):
        assert_same_signals(db, window)
    assert_same_signals(db, Window(T0 + 0.5, T0 + 199.5), Filters(instance="gpu-1", drafter="none"))
    assert_same_signals(db, Window(T0, T0 + 200), Filters(mode="speculative", arm="spec"))
    assert_same_alert_signals(db, T0 + 180.25, 150)


def test_parts_of_a_window_not_aggregated_come_from_raw_rows(db):
    """Aggregates gone before T0 + 100 (as before the migration, or after retention): the window's
    part before that is read from raw rows, and the totals stay those of the raw rows."""
    store_in_batches(db, workload())
    with db.begin() as conn:
        assert aggregates.apply_retention(conn, T0 + 100.4) > 0
        assert aggregates.covered_from(conn) == T0 + 100
    assert_same_signals(db, Window(T0 + 3.3, T0 + 190.2))
    assert_same_alert_signals(db, T0 + 190.2, 186.9)


def test_migration_covers_from_after_the_newest_stored_request(tmp_path):
    db = make_db(f"sqlite:///{tmp_path / 'db.sqlite'}")
    upgrade(db, "0008")
    older = workload(500, span_s=100)
    at_0008 = [c for c in REQUESTS.columns if c not in ("drafts_per_position", "failed_device_s")]  # 0014, 0016
    rows = [{c: RequestRecord.model_validate(r).__dict__[c] for c in at_0008} for r in older]
    with db.begin() as conn:
        conn.execute(insert(Request.__table__), rows)
    upgrade(db)
    newest = max(r["started_at"] for r in older)
    with db.connect() as conn:
        assert aggregates.covered_from(conn) == np.floor(newest) + 1
    store_in_batches(db, workload(1500, start=T0 + 60, span_s=140, seed=6, first_id=500))  # overlaps the older rows
    assert_same_signals(db, Window(T0 + 10.5, T0 + 199.9))
    assert aggregate_sums(db)[0] == 1500
    db.dispose()


class StatementLog:
    """The SQL statements an engine runs while it is listened to."""

    def __init__(self, db) -> None:
        self.db, self.statements, self.parameters = db, [], []
        event.listen(db, "before_cursor_execute", self.record)

    def record(self, conn, cursor, statement, parameters, context, executemany) -> None:
        self.statements.append(statement)
        self.parameters.append(list(parameters.values() if isinstance(parameters, dict) else parameters))

    def reading(self, table: str) -> int:
        return sum(f"FROM {table}" in s for s in self.statements)

    def close(self) -> None:
        event.remove(self.db, "before_cursor_execute", self.record)


def test_one_cycle_s_queries_share_their_reads_and_equal_fresh_queries(db):
    store = store_in_batches(db, workload())
    now, source = T0 + 180.25, StoreSignals(db)
    cycle, log = source.cycle(now), StatementLog(db)
    acceptance = cycle.query("acceptance_rate", 150, ["instance", "mode"], now)
    # raw rows: the partial seconds, and the last 120 s for the speculation-inactive gate (once per cycle)
    assert log.reading("request_window_aggregates") == 1 and log.reading("requests") == 3
    log.statements.clear()
    stddev = cycle.query("acceptance_stddev", 150, ["instance"], now)
    assert log.statements == []  # the same window: nothing read again, only grouped differently
    ttft = cycle.query("ttft_p99", 150, ["instance", "arm"], now)
    assert log.reading("request_window_aggregates") == 1 and log.reading("requests") == 0  # the TTFT sketches
    log.statements.clear()
    cycle.query("oom_count", 170, ["instance"], now)
    assert log.reading("request_window_aggregates") == 1 and log.reading("requests") == 1  # the left end only
    log.close()
    for name, samples, group_by in [
        ("acceptance_rate", acceptance, ["instance", "mode"]),
        ("acceptance_stddev", stddev, ["instance"]),
        ("ttft_p99", ttft, ["instance", "arm"]),
    ]:
        assert samples == source.query(name, 150, group_by, now), name
    later = [request_dict(10_000 + i, started_at=T0 + 100 + i) for i in range(30)]
    store.insert(IngestBatch.model_validate({"requests": later}))
    assert cycle.query("acceptance_rate", 150, ["instance", "mode"], now) == acceptance  # as first read
    fresh = source.query("acceptance_rate", 150, ["instance", "mode"], now)
    assert sum(s.count for s in fresh) > sum(s.count for s in acceptance)


def test_an_alert_cycle_reads_the_aggregates_once_per_window(db):
    """The shipped rules ask for 5 min (three request signals, one with TTFT sketches), 15 min,
    1 h and 10 min: five reads of the aggregates in all, however many signals share a window."""
    store_in_batches(db, workload())
    runner = AlertRunner(db, load_config(), source=StoreSignals(db))
    windows = {rule.window for rule in runner.config.rules if rule.signal in REQUEST_SIGNALS}
    assert len(windows) == 4
    log = StatementLog(db)
    report = runner.cycle(T0 + 180.25)
    log.close()
    runner.close()
    assert report.errors == {} and log.reading("request_window_aggregates") == len(windows) + 1


def test_a_reader_s_windows_read_in_any_order_equal_fresh_reads(db):
    """Windows ending together, asked in an order that cuts segments inside segments already read."""
    store_in_batches(db, workload(), batches=9)
    now = T0 + 180.25
    reader, log = window_signals.WindowReader(db, now), StatementLog(db)
    for seconds in (150, 170.5, 160, 100, 200, 170.5):
        log.statements.clear()
        log.parameters.clear()
        got = reader.totals(now - seconds, ("instance", "mode"), with_sketches=("ttft",))
        if seconds == 200:  # only the seconds before the 170.5 s window's are new: their sums and sketches
            assert log.reading("request_window_aggregates") == 2
            bounds = [v for q, v in zip(log.statements, log.parameters) if "FROM request_window_aggregates" in q]
            assert all(math.ceil(now - 170.5) in values for values in bounds)
        want = window_signals.window_totals(db, Window(now - seconds, now), ("instance", "mode"))
        assert got.keys() == want.keys() and want
        for key, totals in want.items():
            assert got[key].sums == pytest.approx(totals.sums, rel=1e-12), (seconds, key)
            assert got[key].rate_m2 == pytest.approx(totals.rate_m2, rel=1e-9), (seconds, key)
            merged, whole = got[key].sketches["ttft"], totals.sketches["ttft"]
            assert (merged.zeros, merged.min_key, merged.counts.tolist()) == (
                whole.zeros,
                whole.min_key,
                whole.counts.tolist(),
            )
    log.close()


def test_rates_divide_by_the_time_the_work_took(db):
    """Issue 57 #6: rates ran from the first start to the last start + 1 s, so the tokens made after the
    last start got no time, and a load stopping inside the window read high (90.1 tok/s against the
    client's 76.3). Now from the first start to the last finish, clipped to the window; raw rows and
    aggregates alike."""
    starts = [T0 + 10.4 + 1.25 * i for i in range(8)]
    records = [request_dict(i, started_at=s, e2e_s=10.0, output_tokens=96) for i, s in enumerate(starts)]
    store_in_batches(db, records, batches=2)
    work = starts[-1] + 10.0 - starts[0]
    for window, active in ((Window(T0, T0 + 60), work), (Window(T0, T0 + 20), T0 + 20 - starts[0])):
        for read in (signals, window_signals.signals):
            got = read(db, window)
            assert got.active_s == pytest.approx(active, abs=1e-6), (read, window)
            assert got.output_tokens_per_s == pytest.approx(8 * 96 / active, rel=1e-9), (read, window)
            assert got.request_rate_per_s == pytest.approx(8 / active, rel=1e-9), (read, window)
