"""Per-minute rollups: equal to the raw rows they summarise, late data folded in, retention safe."""

from __future__ import annotations

import time

import numpy as np
import pytest
from collector_payloads import T0, request_dict, varied_request
from fastapi.testclient import TestClient
from sqlalchemy import func, select, update
from waiting import wait_for

from specwatch.collector.ingest.store import Store
from specwatch.collector.models import LATENCY_BUCKETS, Request, RequestRollup, RequestRollupHourly
from specwatch.collector.reads import reader
from specwatch.collector.reads.history import errors_by_hour_long, histogram_quantile, long_series
from specwatch.collector.reads.long_signals import long_signals
from specwatch.collector.reads.queries import Filters, Window, errors_by_hour, signals
from specwatch.collector.reads.series import series
from specwatch.collector.settings import Settings
from specwatch.collector.tiers.rollups import apply_retention, roll_up
from specwatch.service.app import create_app
from specwatch.telemetry.schema import MAX_TOKENS, IngestBatch

DAY = 86400.0
HOUR0 = T0 - T0 % 3600  # 20:00 UTC, the hour the data starts in
N = 400  # 3 s apart: 20 minutes of requests
LATENCY_REL = 0.011  # sketch percentiles: within 1% of the exact value at their rank (and the interpolation)


@pytest.fixture
def stored(db) -> list[dict]:
    rng = np.random.default_rng(3)
    rows = [varied_request(i, rng) for i in range(N)]
    Store(db).insert(IngestBatch.model_validate({"requests": rows}))
    return rows


def test_histogram_quantile_interpolates_like_promql():
    counts = np.zeros(len(LATENCY_BUCKETS) + 1)
    counts[1] = 10  # ten values in (0.01, 0.025]
    assert histogram_quantile(0.5, counts) == pytest.approx(0.0175)
    counts[-1] = 90  # most above the largest bound: Prometheus answers that bound
    assert histogram_quantile(0.99, counts) == LATENCY_BUCKETS[-1]
    assert histogram_quantile(0.5, np.zeros(len(LATENCY_BUCKETS) + 1)) is None


def test_rollups_sum_to_the_raw_rows(db, stored):
    report = roll_up(db, now=T0 + DAY)
    assert report.rows_folded == N and roll_up(db, now=T0 + DAY).rows_folded == 0
    with db.connect() as conn:
        raw = conn.execute(
            select(func.count(), func.sum(Request.num_accepted_tokens), func.sum(Request.output_tokens))
        ).one()
        for table in (RequestRollup, RequestRollupHourly):
            rolled = conn.execute(
                select(func.sum(table.requests), func.sum(table.accepted_tokens), func.sum(table.output_tokens))
            ).one()
            assert tuple(raw) == tuple(rolled)


def test_long_series_from_rollups_matches_raw_series(db, stored):
    roll_up(db, now=T0 + DAY)
    hourly, minutely = (Window(HOUR0, HOUR0 + 2 * 3600), 3600), (Window(HOUR0 + 60, HOUR0 + 3660), 600)
    filters_cases = (Filters(), Filters(instance="gpu-1"), Filters(drafter="none"), Filters(mode="speculative"))
    for filters, (window, step) in [(f, w) for f in filters_cases for w in (hourly, minutely)]:
        rolled, raw = long_series(db, window, filters, step), series(db, window, filters, step)
        assert len(rolled) == len(raw) and sum(p.requests for p in rolled) > 0
        for r, x in zip(rolled, raw):
            assert (r.t, r.requests, r.errors, r.draft_tokens, r.accepted_tokens) == (
                x.t,
                x.requests,
                x.errors,
                x.draft_tokens,
                x.accepted_tokens,
            )
            assert (r.acceptance_rate_mean, r.acceptance_rate_stddev) == pytest.approx(
                (x.acceptance_rate_mean, x.acceptance_rate_stddev)
            )
            for name in ("ttft_p50", "ttft_p99", "e2e_p50", "e2e_p99", "tpot_p50", "tpot_p99"):
                want = getattr(x, name)
                assert getattr(r, name) == (None if want is None else pytest.approx(want, rel=LATENCY_REL)), name


def test_late_records_are_folded_into_their_minute(db, stored, monkeypatch):
    monkeypatch.setattr("specwatch.collector.tiers.rollups.CHUNK_ROWS", 150)  # several transactions per pass
    assert roll_up(db, now=T0 + DAY).rows_folded == N
    late = request_dict(10_000, started_at=T0 + 30.5)  # a minute rolled up long ago
    Store(db).insert(IngestBatch.model_validate({"requests": [late]}))
    for period in (60, 3600):  # read straight away, the late row comes from the raw table
        assert sum(p.requests for p in long_series(db, Window(HOUR0, HOUR0 + 3600), step_s=period)) == N + 1
    assert roll_up(db, now=T0 + DAY + 60).rows_folded == 1
    point = long_series(db, Window(HOUR0, HOUR0 + 3600), step_s=3600)[0]
    assert point.requests == N + 1


def test_retention_keeps_rollups_and_deletes_only_rolled_up_rows(db, stored):
    assert apply_retention(db, now=T0 + 30 * DAY, raw_retention_s=14 * DAY, rollup_retention_s=400 * DAY) == (0, 0)
    roll_up(db, now=T0 + 30 * DAY)
    deleted_raw, deleted_rollups = apply_retention(
        db, now=T0 + 30 * DAY, raw_retention_s=14 * DAY, rollup_retention_s=400 * DAY
    )
    assert deleted_raw == N and deleted_rollups == 0
    window = Window(HOUR0, HOUR0 + 3600)
    assert series(db, window, step_s=3600)[0].requests == 0
    assert long_series(db, window, step_s=3600)[0].requests == N
    assert apply_retention(db, now=T0 + 500 * DAY, raw_retention_s=14 * DAY, rollup_retention_s=400 * DAY)[1] > 0


def test_service_runs_maintenance_in_the_background(db_url, tmp_path):
    settings = Settings(data_dir=tmp_path, database_url=db_url, maintenance_interval_s=0.05, retention_days=1)
    old = request_dict(1, started_at=time.time() - 3 * DAY)
    with TestClient(create_app(settings)) as client:
        assert client.post("/v1/ingest", json={"requests": [old]}).json()["accepted"] == 1
        db = client.app.state.store.db

        def counts() -> tuple[int, int | None]:
            with db.connect() as conn:
                return (
                    conn.scalar(select(func.count()).select_from(Request)),
                    conn.scalar(select(func.sum(RequestRollup.requests))),
                )

        # rolled up, then deleted by the raw retention of one day
        wait_for(
            lambda: counts() == (0, 1),
            lambda: f"the rollup and the raw deletion: (raw, rolled) = {counts()}",
            timeout=10,
            interval=0.05,
        )


@pytest.mark.parametrize("rolled", [False, True])
def test_long_signals_add_up_rollups_and_raw_rows(db, stored, rolled):
    if rolled:
        roll_up(db, now=T0 + 3 * 3600)  # rollups cover everything up to T0+3h-GRACE_S
        late = request_dict(10_000, started_at=T0 + 30.5)  # arrives after the pass, inside the rolled span
        Store(db).insert(IngestBatch.model_validate({"requests": [late]}))
    window = Window(T0 - 7 * 3600 + 17.5, T0 + 3000)  # > 6 h, not minute-aligned
    exact, estimate = signals(db, window), long_signals(db, window)
    assert (estimate.requests, estimate.errors, estimate.ooms, estimate.draft_tokens, estimate.accepted_tokens) == (
        exact.requests,
        exact.errors,
        exact.ooms,
        exact.draft_tokens,
        exact.accepted_tokens,
    )
    assert estimate.acceptance_rate_mean == pytest.approx(exact.acceptance_rate_mean)
    assert estimate.acceptance_rate_stddev == pytest.approx(exact.acceptance_rate_stddev)
    assert estimate.mean_acceptance_length == pytest.approx(exact.mean_acceptance_length)
    assert_same_percentiles(estimate, exact)


def assert_same_percentiles(got, want) -> None:
    """TTFT, e2e and TPOT percentiles from sketches: within the sketch's relative accuracy of raw rows'."""
    for name in ("ttft", "e2e", "tpot"):
        g, w = getattr(got, name), getattr(want, name)
        assert g.count == w.count > 0 and g.basis is None, name
        for q in ("p50", "p90", "p95", "p99"):
            assert getattr(g, q) == pytest.approx(getattr(w, q), rel=LATENCY_REL), (name, q)


def test_signals_beyond_six_hours_carry_tpot_from_the_rollup_sketches(db, stored):
    roll_up(db, now=T0 + 2 * DAY)
    with db.connect() as conn:  # the rolled span really is read from the rollups' sketches
        assert conn.scalar(select(func.sum(RequestRollupHourly.sketched))) == N
    window = Window(HOUR0 - DAY, HOUR0 + DAY)  # whole hours: the hourly rows
    assert reader.tier(window, Filters()) == "rollups"
    for filters in (Filters(), Filters(instance="gpu-1"), Filters(mode="speculative")):
        got, want = reader.signals(db, window, filters), signals(db, window, filters)
        assert got.requests == want.requests
        assert_same_percentiles(got, want)
    edges = Window(T0 - 7 * 3600 + 17.5, T0 + 1500.25)  # per-minute rows and raw edges
    assert_same_percentiles(long_signals(db, edges), signals(db, edges))


def test_rollup_rows_from_before_migration_0011_answer_from_their_histograms(db, stored):
    roll_up(db, now=T0 + 2 * DAY)
    with db.begin() as conn:  # as migration 0011 leaves rows written before it
        for table in (RequestRollup, RequestRollupHourly):
            conn.execute(update(table).values(sketched=0, ttft_sketch=None, e2e_sketch=None, tpot_sketch=None))
    window = Window(HOUR0 - DAY, HOUR0 + DAY)
    got, want = long_signals(db, window), signals(db, window)
    assert got.requests == N and got.ttft.basis == got.e2e.basis == got.tpot.basis == "histogram"
    assert got.ttft.count == want.ttft.count and got.tpot.count == 0 and got.tpot.p99 is None
    i = int(np.searchsorted(LATENCY_BUCKETS, want.ttft.p99))  # the estimate lies in the exact value's bucket
    assert (0.0 if i == 0 else LATENCY_BUCKETS[i - 1]) <= got.ttft.p99 <= LATENCY_BUCKETS[i]
    point = long_series(db, window, step_s=3600)[24]  # HOUR0's
    assert point.requests == N and point.ttft_p99 == pytest.approx(got.ttft.p99) and point.tpot_p99 is None


def test_signals_endpoint_switches_to_rollups_for_long_windows(client, make_request):
    rows = [make_request(i) for i in range(50)]
    assert client.post("/v1/ingest", json={"requests": rows}).status_code == 200
    short = client.get("/v1/signals", params={"start": T0, "end": T0 + 3600}).json()
    long = client.get("/v1/signals", params={"start": T0 - 86400, "end": T0 + 3600}).json()
    assert short["requests"] == long["requests"] == 50
    assert short["tpot"] == long["tpot"] and long["tpot"]["count"] == 50  # TPOT in every tier


def test_errors_by_hour_from_rollups_match_raw(db, stored):
    roll_up(db, now=T0 + 2 * DAY)
    late = request_dict(10_000, started_at=T0 + 1.5 * DAY, status="error", error="draft:oom")  # a raw edge hour
    unrolled = request_dict(10_001, started_at=T0 + 100, status="error", error="target:oom")  # inside rolled hours
    Store(db).insert(IngestBatch.model_validate({"requests": [late, unrolled]}))
    window = Window(T0 - DAY + 123.0, T0 + 1.5 * DAY + 60)
    assert errors_by_hour_long(db, window) == errors_by_hour(db, window)
    assert sum(h.ooms for h in errors_by_hour_long(db, window, Filters(instance="gpu-0"))) == sum(
        h.ooms for h in errors_by_hour(db, window, Filters(instance="gpu-0"))
    )


def test_the_acceptance_spread_survives_rates_close_to_one_another(db):
    """Rates that differ in their 9th digit: merged from M2 (Chan) the rollups give numpy's stddev, where
    a sum of squares (sumsq - sum^2 / n) loses it to cancellation (issue 51). The counts are near the
    contract's cap (MAX_TOKENS: accepted tokens are output tokens)."""
    drafted = MAX_TOKENS - 4
    quarter = drafted // 4
    rows = [
        request_dict(i, num_drafts=quarter, num_draft_tokens=drafted, num_accepted_tokens=drafted - i % 2)
        | {"accepted_per_position": [quarter] * 3 + [quarter - i % 2], "output_tokens": MAX_TOKENS}
        for i in range(600)
    ]
    Store(db).insert(IngestBatch.model_validate({"requests": rows}))
    roll_up(db, now=T0 + DAY)
    rates = np.array([r["num_accepted_tokens"] / drafted for r in rows])
    naive = np.sqrt(max(0.0, (rates * rates).sum() / len(rates) - rates.mean() ** 2))
    assert abs(naive - rates.std()) > 0.01 * rates.std()  # the case does defeat a sum of squares
    window = Window(T0 - 7 * 3600, T0 + 3600)  # > 6 h: the rollup tier
    assert long_signals(db, window).acceptance_rate_stddev == pytest.approx(rates.std(), rel=1e-6)
    (point,) = [p for p in long_series(db, Window(HOUR0, HOUR0 + 3600), step_s=3600) if p.requests]
    assert point.acceptance_rate_stddev == pytest.approx(rates.std(), rel=1e-6)


def test_a_rollup_that_would_wrap_int64_is_refused_and_logged(db, caplog):
    """Rows stored before the contract capped counts (issue 53 #1: two records of 2**62 output tokens
    wrapped the rollups' int64 sums negative): their group is refused and logged, every other group is
    rolled up, and the pass does not fail."""
    rows = [request_dict(i, instance="hostile" if i < 2 else "gpu-0") for i in range(6)]
    Store(db).insert(IngestBatch.model_validate({"requests": rows}))
    with db.begin() as conn:
        conn.execute(update(Request).where(Request.instance == "hostile").values(output_tokens=2**62))
    with caplog.at_level("ERROR", logger="specwatch.collector.tiers.rollups"):
        assert roll_up(db, now=T0 + DAY).rows_folded == 6
    assert "int64 would wrap" in caplog.text and "hostile" in caplog.text
    with db.connect() as conn:
        for table in (RequestRollup, RequestRollupHourly):
            by_instance = dict(
                conn.execute(select(table.instance, func.sum(table.requests)).group_by(table.instance)).all()
            )
            assert by_instance == {"gpu-0": 4}
            assert conn.scalar(select(func.min(table.output_tokens))) >= 0
