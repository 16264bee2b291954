"""The tiered reader (`collector.reads.reader`): totals, series, labels and comparisons from the per-second
aggregates equal those from raw rows, across the tier boundaries (partial seconds at both ends,
seconds stored before the aggregates' coverage start), on SQLite and PostgreSQL; large windows read a
sample of time slices over the span with traffic, and say so."""

from __future__ import annotations

import dataclasses

import pytest
from collector_payloads import T0
from sqlalchemy import delete, func, select, update
from test_window_aggregates import store_in_batches, workload

from specwatch.collector.models import MaintenanceState, Request
from specwatch.collector.reads import breakdown, queries, reader, window_signals
from specwatch.collector.reads.queries import Filters, Window, signals
from specwatch.collector.reads.series import series
from specwatch.collector.tiers import aggregates
from specwatch.collector.tiers.aggregates import WindowAggregate

LATENCY_REL = 0.011  # sketch percentiles: within 1% of the exact value at their rank (and the interpolation)


@pytest.fixture
def stored(db):
    store_in_batches(db, workload(3000, span_s=200.0))
    return db


def uncover_before(db, second: int) -> None:
    """As if the aggregates started at `second` (rows stored before migration 0009): readers must
    take raw rows for the seconds before it."""
    with db.begin() as conn:
        conn.execute(delete(WindowAggregate).where(WindowAggregate.period_start < second))
        conn.execute(
            update(MaintenanceState).where(MaintenanceState.key == aggregates.COVERED_FROM).values(value=float(second))
        )


def close(got: float | None, want: float | None, rel: float) -> bool:
    return (got is None and want is None) or got == pytest.approx(want, rel=rel)


def assert_points_match(got, want) -> None:
    assert len(got) == len(want)
    for g, w in zip(got, want):
        exact = ("t", "requests", "errors", "output_tokens", "drafts", "draft_tokens", "accepted_tokens")
        assert [getattr(g, f) for f in exact] == [getattr(w, f) for f in exact]
        assert close(g.acceptance_rate, w.acceptance_rate, 1e-12)
        assert close(g.acceptance_rate_mean, w.acceptance_rate_mean, 1e-9)
        assert close(g.acceptance_rate_stddev, w.acceptance_rate_stddev, 1e-6)
        for name in ("ttft_p50", "ttft_p99", "e2e_p50", "e2e_p99", "tpot_p50", "tpot_p99"):
            assert close(getattr(g, name), getattr(w, name), LATENCY_REL), name


@pytest.mark.parametrize("covered_from", [None, int(T0) + 95])
def test_series_from_aggregates_equals_raw_rows_step_by_step(stored, covered_from):
    if covered_from is not None:
        uncover_before(stored, covered_from)
    window = Window(T0 + 10, T0 + 190.5)  # steps on whole seconds; a partial second at the end
    got = reader.series(stored, window, step_s=30)
    assert_points_match(got, series(stored, window, step_s=30))
    assert any(p.tpot_p99 is not None for p in got)  # TPOT is carried


@pytest.mark.parametrize("covered_from", [None, int(T0) + 57])
def test_signals_and_their_rates_equal_raw_rows_across_tier_boundaries(stored, covered_from):
    if covered_from is not None:
        uncover_before(stored, covered_from)
    window = Window(T0 + 3.25, T0 + 150.75)  # partial seconds at both ends
    got, want = reader.signals(stored, window), signals(stored, window)
    for name in ("requests", "errors", "ooms", "output_tokens", "drafts", "draft_tokens", "accepted_tokens"):
        assert getattr(got, name) == getattr(want, name), name
    assert got.active_s == want.active_s and 0 < got.active_s <= window.seconds
    assert got.request_rate_per_s == pytest.approx(want.requests / want.active_s, rel=1e-12)
    assert got.output_tokens_per_s == pytest.approx(want.output_tokens_per_s, rel=1e-12)
    assert got.tpot.p99 == pytest.approx(want.tpot.p99, rel=LATENCY_REL)


def test_active_span_is_the_part_of_the_window_with_traffic(stored):
    window = Window(T0 - 3600, T0 + 3600)  # requests start only in [T0, T0 + 200), each runs for its e2e
    got = reader.signals(stored, window)
    with stored.connect() as conn:
        first_start, last_finish = conn.execute(
            select(func.min(Request.started_at), func.max(Request.started_at + Request.e2e_s))
        ).one()
    assert got.active_s == pytest.approx(last_finish - first_start)
    assert got.request_rate_per_s == pytest.approx(got.requests / got.active_s)
    empty = reader.signals(stored, Window(T0 - 600, T0 - 300))
    assert (empty.requests, empty.active_s, empty.request_rate_per_s, empty.output_tokens_per_s) == (0, 0.0, 0.0, 0.0)


@pytest.mark.parametrize("by", ["mode", "arm", "instance"])
def test_grouped_totals_equal_raw_groups(stored, by):
    uncover_before(stored, int(T0) + 120)
    window = Window(T0 + 0.5, T0 + 199.5)
    got = reader.totals(stored, window, Filters(), (by,))
    for (value,), totals in got.items():
        raw = signals(stored, window, dataclasses.replace(Filters(), **{by: "none" if value is None else value}))
        if by == "arm" and value is None:  # Filters has no "arm is NULL"
            continue
        assert (totals.requests, int(totals.sums["accepted_tokens"])) == (raw.requests, raw.accepted_tokens)
        assert totals.active_s(window) == raw.active_s
    assert sum(t.requests for t in got.values()) == signals(stored, window).requests


def test_compare_and_labels_sample_large_windows_and_say_so(stored, monkeypatch):
    window = Window(T0, T0 + 200)
    exact = breakdown.compare(stored, window, by="mode")
    assert exact.sampled is None
    monkeypatch.setattr(queries, "SAMPLE_ROWS", 500)
    sampled = breakdown.compare(stored, window, by="mode")
    assert sampled.sampled.of == 3000 and 300 < sampled.sampled.rows < 800
    for name in ("speculative", "plain"):
        got, want = getattr(sampled, name), getattr(exact, name)
        assert (got.requests, got.accepted, got.output_tokens) == (want.requests, want.accepted, want.output_tokens)
        assert got.s_per_token.p50 == pytest.approx(want.s_per_token.p50, rel=0.2)  # a sample's median
    assert sampled.p_value is not None and 0.5 < sampled.speedup / exact.speedup < 2
    labels = reader.label_values(stored, window)
    assert labels["sampled"] == {"rows": sampled.sampled.rows, "of": 3000}
    assert sum(labels["mode"].values()) == 3000 and set(labels["instance"]) == {"gpu-0", "gpu-1", "gpu-2"}
    wide = Window(T0 - 3600, T0 + 200)  # an idle hour first: slices cover only the span with traffic
    assert breakdown.compare(stored, wide, by="mode").sampled == sampled.sampled
    assert reader.label_values(stored, wide)["sampled"] == labels["sampled"]
    untagged = reader.label_values(stored, window, tag_keys=())  # labels alone: exact, from the aggregates
    assert "sampled" not in untagged and "tag:scenario" not in untagged and untagged["mode"] == labels["mode"]


def test_sample_slices_spread_over_the_span_with_traffic(monkeypatch):
    monkeypatch.setattr(queries, "SAMPLE_ROWS", 1000)
    population = queries.Population.of(Window(T0 - 3600, T0 + 200), 10_000, T0, T0 + 100)
    assert population.span == Window(T0, T0 + 100)
    slices = queries.sample_slices(population)
    stratum = 100 / queries.SAMPLE_SLICES
    assert len(slices) == queries.SAMPLE_SLICES
    for i, piece in enumerate(slices):  # one slice a tenth of each stratum wide, inside it
        assert piece.seconds == pytest.approx(stratum / 10)
        assert T0 + i * stratum <= piece.start and piece.end <= T0 + (i + 1) * stratum + 1e-9
    offsets = [(piece.start - T0) % stratum for piece in slices]
    assert len({round(o, 6) for o in offsets}) == len(offsets)  # not in step with periodic traffic


def test_a_sample_reads_only_its_slices(stored, monkeypatch):
    """The sample is the requests of its slices, read by time range: none outside them, all inside."""
    monkeypatch.setattr(queries, "SAMPLE_ROWS", 500)
    window = Window(T0, T0 + 200)
    population = reader.population(stored, window, Filters())
    assert population.requests == 3000 and population.span.seconds <= 200
    rows, sample = queries.sample_rows(stored, select(Request.started_at), window, Filters(), population)
    slices = queries.sample_slices(population)
    started = sorted(row[0] for row in rows)
    assert sample == queries.Subset(len(rows), 3000)
    assert all(any(p.start <= t < p.end for p in slices) for t in started)
    with stored.connect() as conn:
        everything = conn.execute(select(Request.started_at).where(Request.started_at >= T0 - 1)).scalars().all()
    assert started == sorted(t for t in everything if any(p.start <= t < p.end for p in slices))
    for answer in (reader.positions(stored, window), reader.acceptance_vs_length(stored, window)):  # JSON, filters
        assert answer.sampled.of == 3000 and 0 < answer.sampled.rows < 800


def test_tag_filters_read_raw_rows(stored):
    window = Window(T0, T0 + 200)
    tagged = Filters(tags=(("tenant", "acme"),))
    assert reader.tier(window, tagged) == "raw" and reader.tier(window, Filters()) == "aggregates"
    got = reader.signals(stored, window, tagged)
    assert got == signals(stored, window, tagged)
    assert 0 < got.requests < 3000
    with pytest.raises(ValueError):
        window_signals.stepped_totals(stored, window, 60, filters=tagged)
