"""One latency bucket list, `telemetry.schema.LATENCY_BUCKETS` (with 0.3 s), for the engine's and the
collector's /metrics and the rollups; rollup rows written before migration 0005 (the old list)
keep answering what they answered (marked `basis="histogram"`: they have no sketches, migration 0011),
late records fold into them, and new rows use the new list."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from alembic import command
from collector_payloads import T0, request_dict
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, column, func, insert, inspect, select, table

from specwatch.alerts.rules import load_config
from specwatch.collector.db import alembic_config, make_db, upgrade
from specwatch.collector.ingest.store import IngestCounts, Store
from specwatch.collector.metrics import CollectorMetrics
from specwatch.collector.models import ADDED_BUCKETS, LEGACY_LATENCY_BUCKETS, Request
from specwatch.collector.reads.history import histogram_quantile, long_series
from specwatch.collector.reads.long_signals import long_signals
from specwatch.collector.reads.queries import Percentiles, Window
from specwatch.collector.tiers.rollups import LAST_ID, LAST_PASS_AT, roll_up
from specwatch.engine.metrics import EngineMetrics
from specwatch.telemetry.schema import LATENCY_BUCKETS, IngestBatch, RequestRecord
from specwatch.telemetry.sink import TelemetrySink

OLD, NEW = LEGACY_LATENCY_BUCKETS, LATENCY_BUCKETS
HOUR0 = T0 - T0 % 3600  # the old rows' hour; the new ones come an hour later
# TTFTs of the old rows: most in (0.25, 0.5], the old bucket the 0.3 bound splits
OLD_TTFT = [0.05, 0.12, 0.22, 0.26, 0.27, 0.28, 0.29, 0.31, 0.35, 0.4, 0.45, 0.6, 0.8, 2.0, 28.0, 200.0]
NEW_TTFT = [0.26, 0.27, 0.28, 0.29, 0.295, 0.3]  # all within (0.25, 0.3]
QUANTILES = (0.5, 0.9, 0.95, 0.99)


def test_default_bounds_contain_the_old_rollup_bounds_and_the_ttft_threshold():
    assert set(OLD) < set(NEW) and list(NEW) == sorted(set(NEW))
    threshold = next(r.threshold for r in load_config().rules if r.name == "TTFTP99High")
    assert threshold == 0.3 and threshold in NEW


def test_engine_and_collector_metrics_expose_the_same_bounds():
    record = RequestRecord.model_validate(request_dict(1, ttft_s=0.29, e2e_s=0.31))
    state = {"override": "auto", "load_allows_speculation": True}
    scheduler = SimpleNamespace(
        active=0, queue_depth=0, load=0.0, policy=SimpleNamespace(state=state), sink=TelemetrySink("t")
    )
    engine_registry = CollectorRegistry()
    EngineMetrics(scheduler, registry=engine_registry).observe(record)
    collector_metrics = CollectorMetrics(CollectorRegistry())
    collector_metrics.record_batch(IngestCounts(requests=1, new_requests=(record,)))
    db, collector = (
        _buckets(engine_registry, "specwatch_engine_"),
        _buckets(collector_metrics.registry, "specwatch_"),
    )
    for name in ("time_to_first_token_seconds", "e2e_request_latency_seconds"):
        assert list(db[name]) == list(collector[name]) == [*(repr(b) for b in NEW), "+Inf"]
    # 0.29 s and 0.31 s lie either side of the 0.3 bound in both
    assert db["time_to_first_token_seconds"]["0.3"] == collector["time_to_first_token_seconds"]["0.3"] == 1
    assert db["e2e_request_latency_seconds"]["0.3"] == collector["e2e_request_latency_seconds"]["0.3"] == 0


def _buckets(registry: CollectorRegistry, prefix: str) -> dict[str, dict[str, float]]:
    """Histogram name (without prefix) -> le -> cumulative count, summed over label sets."""
    found: dict[str, dict[str, float]] = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            if s.name.startswith(prefix) and s.name.endswith("_bucket"):
                le = found.setdefault(s.name[len(prefix) : -len("_bucket")], {})
                le[s.labels["le"]] = le.get(s.labels["le"], 0) + s.value
    return found


def test_rollup_rows_from_before_migration_0005_keep_their_answers(db_url):
    db = make_db(db_url)
    upgrade(db, "0004")
    old = [request_dict(i, started_at=T0 + 7 * i, ttft_s=v, e2e_s=2 * v) for i, v in enumerate(OLD_TTFT)]
    _write_as_before_0005(db, old, pass_at=HOUR0 + 4 * 3600)
    upgrade(db)

    hourly = _bucket_rows(db, "request_rollups_hourly", "ttft", 18)[HOUR0]
    moved = [None if j in ADDED_BUCKETS else _counts(OLD_TTFT, OLD)[OLD.index(b)] for j, b in enumerate(NEW)]
    assert hourly == [*moved, _counts(OLD_TTFT, OLD)[-1]]  # each count under its upper bound; NULL: no such bound
    hours, minutes = Window(HOUR0 - 7 * 3600, HOUR0 + 2 * 3600), Window(HOUR0 - 7 * 3600 + 30, T0 + 1000)
    for window in (hours, minutes):  # the hourly rows, then the per-minute ones
        got = long_signals(db, window)
        assert got.requests == len(old)
        assert got.ttft == _percentiles(OLD_TTFT, OLD) and got.e2e == _percentiles([2 * v for v in OLD_TTFT], OLD)
    point = long_series(db, Window(HOUR0, HOUR0 + 3600), step_s=3600)[0]
    want = _percentiles(OLD_TTFT, OLD)
    assert (point.ttft_p50, point.ttft_p99) == (want.p50, want.p99)

    late = request_dict(1000, started_at=T0 + 1, ttft_s=0.27, e2e_s=0.54)  # into an old row, bucket (0.25, 0.3]
    new = [request_dict(100 + i, started_at=HOUR0 + 3600 + 60 * i, ttft_s=v, e2e_s=v) for i, v in enumerate(NEW_TTFT)]
    Store(db).insert(IngestBatch.model_validate({"requests": [*new, late]}))
    assert roll_up(db, now=HOUR0 + 5 * 3600).rows_folded == len(new) + 1
    rows = _bucket_rows(db, "request_rollups_hourly", "ttft", 18)
    assert rows[HOUR0][6] is None and rows[HOUR0][7] == hourly[7] + 1  # counted one bucket up, as (0.25, 0.5]
    assert rows[HOUR0 + 3600] == _counts(NEW_TTFT, NEW)  # new rows: the 0.3 bucket
    old_hour, new_hour = long_series(db, Window(HOUR0, HOUR0 + 2 * 3600), step_s=3600)
    assert old_hour.ttft_p99 == _percentiles([*OLD_TTFT, 0.27], OLD).p99
    # rows written since migration 0011 answer from their sketches (within 1% of the exact value)
    assert new_hour.ttft_p99 == pytest.approx(np.quantile(NEW_TTFT, 0.99), rel=0.011)
    # a sum with old rows in it is read on the old bounds, the new rows merged onto them exactly
    assert long_signals(db, hours).ttft == _percentiles([*OLD_TTFT, 0.27, *NEW_TTFT], OLD)
    db.dispose()


def test_downgrade_folds_the_added_buckets_back(db_url):
    db = make_db(db_url)
    upgrade(db)
    ttft = [*OLD_TTFT, *NEW_TTFT]
    Store(db).insert(
        IngestBatch.model_validate({"requests": [request_dict(i, ttft_s=v, e2e_s=v) for i, v in enumerate(ttft)]})
    )
    roll_up(db, now=T0 + 3600)
    config = alembic_config()
    with db.begin() as connection:
        config.attributes["connection"] = connection
        command.downgrade(config, "0004")
    assert "ttft_b14" not in {c["name"] for c in inspect(db).get_columns("request_rollups")}
    for name in ("request_rollups", "request_rollups_hourly"):
        assert np.sum(list(_bucket_rows(db, name, "e2e", 14).values()), axis=0).tolist() == _counts(ttft, OLD)
    db.dispose()


def _counts(values: list[float], bounds: tuple[float, ...]) -> list[int]:
    """Non-cumulative counts per bucket (bucket i: bounds[i-1] < v <= bounds[i]; the last: +Inf)."""
    return np.bincount(np.searchsorted(bounds, values, side="left"), minlength=len(bounds) + 1).tolist()


def _percentiles(values: list[float], bounds: tuple[float, ...]) -> Percentiles:
    """What the rollups answered before migration 0005 (on `bounds`), computed here from the values."""
    counts = np.array(_counts(values, bounds))
    quantiles = (pytest.approx(histogram_quantile(q, counts, bounds)) for q in QUANTILES)
    return Percentiles(*quantiles, len(values), basis="histogram")


def _bucket_rows(db: Engine, name: str, kind: str, buckets: int) -> dict[int, list[int | None]]:
    """period_start -> bucket counts of `kind`, from the table as it is (any revision)."""
    columns = [column(f"{kind}_b{i:02d}") for i in range(buckets)]
    with db.connect() as conn:
        rows = conn.execute(select(column("period_start"), *columns).select_from(table(name))).all()
    return {int(start): list(counts) for start, *counts in rows}


def _write_as_before_0005(db: Engine, records: list[dict], pass_at: float) -> None:
    """Raw requests, and the rollups revision 0004's code wrote for them (old buckets, one key)."""
    with db.begin() as conn:
        # the columns revision 0004 had: later columns (server defaults) are left out of the insert
        known = [
            RequestRecord.model_validate(r).model_dump(
                exclude={
                    "draft_counts_known",
                    "mean_lookahead",
                    "device_s",
                    "device_s_source",
                    "drafts_per_position",
                    "failed_device_s",
                }
            )
            for r in records
        ]
        conn.execute(insert(Request.__table__), known)
        for name, period_s in (("request_rollups", 60), ("request_rollups_hourly", 3600)):
            for start in sorted({int(r["started_at"] // period_s) * period_s for r in records}):
                rows = [r for r in records if int(r["started_at"] // period_s) * period_s == start]
                values = {"period_start": start, **_old_row(rows)}
                conn.execute(insert(table(name, *(column(c) for c in values))).values(values))
        last_id = conn.scalar(select(func.max(Request.id)))
        state = table("maintenance_state", column("key"), column("value"))
        conn.execute(
            insert(state).values([{"key": LAST_ID, "value": last_id}, {"key": LAST_PASS_AT, "value": pass_at}])
        )


def _old_row(rows: list[dict]) -> dict:
    r0, rates = rows[0], [r["num_accepted_tokens"] / r["num_draft_tokens"] for r in rows]
    ttft, e2e = _counts([r["ttft_s"] for r in rows], OLD), _counts([r["e2e_s"] for r in rows], OLD)
    return {
        **{"instance": r0["instance"], "model": r0["model"], "mode": r0["mode"], "drafter": r0["drafter"], "arm": ""},
        **{k: sum(r[f] for r in rows) for k, f in _SUMMED.items()},
        **{"requests": len(rows), "errors": 0, "ooms": 0, "rate_n": len(rows), "ttft_count": len(rows)},
        **{"rate_sum": sum(rates), "rate_sumsq": sum(x * x for x in rates)},  # the schema of 0004
        **{"ttft_sum": sum(r["ttft_s"] for r in rows), "e2e_sum": sum(r["e2e_s"] for r in rows)},
        **{f"ttft_b{i:02d}": n for i, n in enumerate(ttft)},
        **{f"e2e_b{i:02d}": n for i, n in enumerate(e2e)},
    }


_SUMMED = {
    "prompt_tokens": "prompt_tokens",
    "output_tokens": "output_tokens",
    "drafts": "num_drafts",
    "draft_tokens": "num_draft_tokens",
    "accepted_tokens": "num_accepted_tokens",
}
