"""The query layer against independently computed expectations (SQLite and PostgreSQL)."""

from __future__ import annotations

import numpy as np
import pytest
from collector_payloads import T0, sample_dict, varied_request

from specwatch.collector.ingest.store import Store
from specwatch.collector.reads.queries import (
    Filters,
    Window,
    acceptance_vs_length,
    errors_by_hour,
    per_position_acceptance,
    signals,
)
from specwatch.collector.reads.series import engine_events, latest_device_samples, series
from specwatch.telemetry.schema import IngestBatch

N = 400


@pytest.fixture
def dataset(db) -> list[dict]:
    rng = np.random.default_rng(7)
    rows = [varied_request(i, rng) for i in range(N)]
    samples = [sample_dict(i, instance=f"gpu-{i % 2}", power_w=float(i)) for i in range(10)]
    Store(db).insert(IngestBatch.model_validate({"requests": rows, "samples": samples}))
    return rows


def expected(rows: list[dict]) -> dict:
    drafted = np.array([r["num_draft_tokens"] for r in rows], float)
    accepted = np.array([r["num_accepted_tokens"] for r in rows], float)
    rates = accepted[drafted > 0] / drafted[drafted > 0]
    ttft = np.array([r["ttft_s"] for r in rows if r["ttft_s"] is not None])
    tpot = [
        (r["e2e_s"] - r["ttft_s"]) / (r["output_tokens"] - 1)
        for r in rows
        if r["ttft_s"] is not None and r["output_tokens"] > 1
    ]
    return {
        "rate": accepted.sum() / drafted.sum(),
        "mean": rates.mean(),
        "std": rates.std(),
        "ttft_p99": np.quantile(ttft, 0.99),
        "tpot_p50": np.quantile(tpot, 0.5),
        "mal": 1 + accepted.sum() / sum(r["num_drafts"] for r in rows),
    }


def test_signals_match_direct_computation(db, dataset):
    window = Window(T0, T0 + N * 3.0)
    got, want = signals(db, window), expected(dataset)
    assert got.requests == N and got.errors == sum(r["status"] == "error" for r in dataset)
    assert got.ooms == sum(1 for r in dataset if r["error"])
    assert got.acceptance_rate == pytest.approx(want["rate"])
    assert got.acceptance_rate_mean == pytest.approx(want["mean"]) and got.acceptance_rate_stddev == pytest.approx(
        want["std"]
    )
    assert got.mean_acceptance_length == pytest.approx(want["mal"])
    assert got.ttft.p99 == pytest.approx(want["ttft_p99"]) and got.tpot.p50 == pytest.approx(want["tpot_p50"])
    assert got.request_rate_per_s == pytest.approx(N / got.active_s)


@pytest.mark.parametrize(
    ("filters", "keep"),
    [
        (Filters(instance="gpu-1"), lambda r: r["instance"] == "gpu-1"),
        (Filters(drafter="none"), lambda r: r["drafter"] is None),
        (
            Filters(mode="speculative", tags=(("tenant", "acme"),)),
            lambda r: r["mode"] == "speculative" and r["tags"]["tenant"] == "acme",
        ),
    ],
)
def test_filters_select_the_right_requests(db, dataset, filters, keep):
    rows = [r for r in dataset if keep(r)]
    got = signals(db, Window(T0, T0 + N * 3.0), filters)
    assert got.requests == len(rows)
    if got.draft_tokens:
        assert got.acceptance_rate == pytest.approx(expected(rows)["rate"])


def test_window_is_start_inclusive_end_exclusive(db, dataset):
    assert signals(db, Window(T0 + 30, T0 + 60)).requests == 10  # i = 10..19
    empty = signals(db, Window(T0 - 100, T0))
    assert (empty.requests, empty.acceptance_rate, empty.ttft.p99, empty.mean_acceptance_length) == (
        0,
        None,
        None,
        None,
    )


def test_per_position_acceptance(db, dataset):
    got = per_position_acceptance(db, Window(T0, T0 + N * 3.0))
    drafts = sum(r["num_drafts"] for r in dataset)
    want = [sum(r["accepted_per_position"][k] for r in dataset if r["gamma"]) / drafts for k in range(4)]
    assert got.drafts == drafts and got.rates == pytest.approx(want)
    assert got.rates == sorted(got.rates, reverse=True)


def test_acceptance_grows_with_prompt_length(db, dataset):
    got = acceptance_vs_length(db, Window(T0, T0 + N * 3.0), by="prompt_tokens")
    assert (
        got.requests == sum(1 for r in dataset if r["num_draft_tokens"])
        and got.spearman_rho > 0.8
        and got.p_value < 1e-6
    )
    rates = [b.acceptance_rate for b in got.buckets if b.requests]
    assert rates == sorted(rates) and sum(b.requests for b in got.buckets) == got.requests


def test_errors_by_hour_of_day(db, dataset):
    hours = errors_by_hour(db, Window(T0, T0 + N * 3.0))
    assert len(hours) == 24 and sum(h.requests for h in hours) == N
    busy = {h.hour for h in hours if h.requests}
    assert busy == {20}  # T0 is 20:26:40 UTC and the data spans 20 minutes
    assert hours[20].errors == sum(r["status"] == "error" for r in dataset)


def test_series_points_agree_with_signals_of_each_minute(db, dataset):
    window = Window(T0, T0 + 600)
    points = series(db, window, step_s=60)
    assert [p.t for p in points] == [T0 + 60 * i for i in range(10)]
    for p in points:
        minute = signals(db, Window(p.t, p.t + 60))
        assert (p.requests, p.errors, p.draft_tokens) == (minute.requests, minute.errors, minute.draft_tokens)
        assert p.acceptance_rate == pytest.approx(minute.acceptance_rate)
        assert p.acceptance_rate_mean == pytest.approx(minute.acceptance_rate_mean)
        assert p.acceptance_rate_stddev == pytest.approx(minute.acceptance_rate_stddev)
        assert p.ttft_p99 == pytest.approx(minute.ttft.p99) and p.e2e_p50 == pytest.approx(minute.e2e.p50)
        assert p.tpot_p99 == pytest.approx(minute.tpot.p99) and p.tpot_p50 == pytest.approx(minute.tpot.p50)


def test_latest_device_samples(db, dataset):
    latest = latest_device_samples(db)
    assert [(d.instance, d.power_w) for d in latest] == [("gpu-0", 8.0), ("gpu-1", 9.0)]
    assert [d.instance for d in latest_device_samples(db, "gpu-1")] == ["gpu-1"]


def test_engine_events_in_window(db, make_event):
    events = [make_event(i, kind="defrag" if i % 2 else "mode_switch", instance=f"gpu-{i % 3}") for i in range(12)]
    Store(db).insert(IngestBatch.model_validate({"events": events}))
    window = Window(T0 + 2, T0 + 10)
    assert [e.at for e in engine_events(db, window)] == [T0 + i for i in range(2, 10)]
    assert [e.at for e in engine_events(db, window, instance="gpu-1", kind="defrag")] == [T0 + 7]
    assert engine_events(db, window, limit=3)[-1].detail == {"to": "autoregressive"}


def test_http_endpoints_serve_the_same_numbers(client, dataset_via_http):
    params = {"start": T0, "end": T0 + N * 3.0}
    body = client.get("/v1/signals", params=params).json()
    assert body["requests"] == N and body["acceptance_rate"] == pytest.approx(expected(dataset_via_http)["rate"])
    assert client.get("/v1/signals", params={**params, "tag": "tenant:acme"}).json()["requests"] == N // 2
    assert len(client.get("/v1/series", params={**params, "step": 60}).json()) == 20
    assert len(client.get("/v1/errors/by-hour", params=params).json()) == 24
    assert client.get("/v1/acceptance/positions", params=params).json()["drafts"] > 0
    assert client.get("/v1/acceptance/length", params={**params, "by": "output_tokens"}).json()["by"] == "output_tokens"
    assert client.get("/v1/devices/latest").json() == []
    assert client.get("/v1/events", params=params).json() == []
    for bad in (
        {"start": T0},
        {"start": T0, "end": T0 - 1},
        {**params, "tag": "nocolon"},
        {**params, "mode": "x"},
        {"last": -5},
        {**params, "step": 0.001},
    ):
        assert client.get("/v1/signals" if "step" not in bad else "/v1/series", params=bad).status_code == 422, bad


@pytest.fixture
def dataset_via_http(client) -> list[dict]:
    rng = np.random.default_rng(7)
    rows = [varied_request(i, rng) for i in range(N)]
    assert client.post("/v1/ingest", json={"requests": rows}).status_code == 200
    return rows
