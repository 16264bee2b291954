"""Cost as a signal through the real service: `specwatch_cost_usd_per_mtok{arm}` on /metrics and
GET /v1/cost/daily (its shape, each day's figures equal to GET /v1/cost over that day, the 400s)."""

from __future__ import annotations

import math
import time

import pytest
from collector_payloads import T0, plain_request_dict, request_dict
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from specwatch.collector.ingest.store import Store
from specwatch.collector.reads.queries import Window
from specwatch.cost.inputs import load_prices
from specwatch.service.cost_gauges import DAY_S, GAUGE, CostGauge, DailyCosts, arm_costs
from specwatch.telemetry.schema import IngestBatch

TIMED = {"device_s_source": "engine", "output_tokens": 64, "queue_s": 0.0}


def served(start: float, first: int = 0, n: int = 20) -> list[dict]:
    """`n` speculative requests (1 s, 0.5 device-s each) and `n` plain ones (2 s, 1 device-s) from `start`."""
    spec = [request_dict(first + i, started_at=start + i, e2e_s=1.0, device_s=0.5, **TIMED) for i in range(n)]
    plain = [
        plain_request_dict(first + 500 + i, started_at=start + i, e2e_s=2.0, device_s=1.0, **TIMED) for i in range(n)
    ]
    return spec + plain


def cost_series(client) -> dict[str, float]:
    """arm -> $ per 1M tokens, as GET /metrics shows them."""
    response = client.get("/metrics")
    assert response.status_code == 200
    return {
        s.labels["arm"]: s.value
        for family in text_string_to_metric_families(response.text)
        for s in family.samples
        if s.name == GAUGE
    }


def test_metrics_shows_each_arms_cost_per_mtok_over_the_last_hour(client):
    now = time.time()
    records = served(now - 120) + served(now - 2 * 3600, first=1000)  # the second lot is outside the hour
    assert client.post("/v1/ingest", json={"requests": records}).status_code == 200
    shown = cost_series(client)
    db = client.app.state.store.db
    expected = {
        arm.key: arm.total_usd_per_mtok
        for arm, _, _ in arm_costs(db, Window(now - 3600, time.time()), load_prices(), "H100-SXM")
    }
    assert set(shown) == {"autoregressive", "speculative:ngram"} == set(expected)
    assert shown == pytest.approx(expected, rel=1e-6)
    assert shown["speculative:ngram"] < shown["autoregressive"]  # half the device time per token


def test_gauge_exports_nothing_without_arms_and_recomputes_after_its_ttl(db):
    clock = [T0 + 600.0]
    registry = CollectorRegistry()
    CostGauge(db, load_prices(), registry=registry, ttl_s=60, clock=lambda: clock[0])
    value = lambda arm: registry.get_sample_value(GAUGE, {"arm": arm})  # noqa: E731
    assert value("autoregressive") is None  # an empty store: no series
    Store(db).insert(IngestBatch.model_validate({"requests": served(T0)}))
    clock[0] += 59
    assert value("autoregressive") is None  # within the TTL: the cached answer
    clock[0] += 1
    assert value("autoregressive") > value("speculative:ngram") > 0


def test_daily_series_prices_each_utc_day_like_the_cost_endpoint(client):
    now = time.time()
    today = math.floor(now / DAY_S) * DAY_S
    records = served(today - 2 * DAY_S + 3600) + served(max(today, now - 60), first=2000)
    assert client.post("/v1/ingest", json={"requests": records}).status_code == 200
    got = client.get("/v1/cost/daily", params={"days": 3})
    assert got.status_code == 200, got.text
    body = got.json()
    assert body["days"] == 3 and body["gpu_type"] == "H100-SXM" and body["gpu_type_source"] == "assumed"
    day = lambda start: time.strftime("%Y-%m-%d", time.gmtime(start))  # noqa: E731
    two_days_ago = day(today - 2 * DAY_S)
    assert [(r["day"], r["arm"]) for r in body["rows"]] == [
        (two_days_ago, "autoregressive"),
        (two_days_ago, "speculative:ngram"),
        (day(today), "autoregressive"),
        (day(today), "speculative:ngram"),
    ]
    for row in body["rows"]:
        assert (row["requests"], row["output_tokens"]) == (20, 20 * 64)
        assert row["estimate"] and "memory unmeasured" in row["estimated"]  # no device samples
        window = {"start": row["start"], "end": row["start"] + DAY_S}
        model = client.get("/v1/cost", params=window).json()["tco"]
        (arm,) = [a for a in model["arms"] if a["key"] == row["arm"]]
        assert row["usd_per_mtok"] == pytest.approx(arm["total_usd_per_mtok"], rel=1e-6)
        assert row["gpu_hours_per_mtok"] == pytest.approx(arm["gpu_hours_per_mtok"], rel=1e-6)


def test_daily_costs_keep_a_finished_day_and_reprice_today_after_the_ttl(db):
    """T0 is 20:26 UTC: yesterday ended 20 h before, so its figures are final; today's last 300 s."""
    clock = [T0]
    today = math.floor(T0 / DAY_S) * DAY_S
    store = Store(db)
    store.insert(
        IngestBatch.model_validate({"requests": served(today - DAY_S + 3600) + served(today + 60, first=1000)})
    )
    daily = DailyCosts(db, load_prices(), ttl_s=300, clock=lambda: clock[0])
    requests = lambda: [row.requests for row in daily.series(2).rows]  # noqa: E731
    assert requests() == [20, 20, 20, 20]  # (yesterday, today) x (autoregressive, speculative:ngram)
    late = served(today - DAY_S + 7200, first=2000, n=5) + served(today + 600, first=3000, n=5)
    store.insert(IngestBatch.model_validate({"requests": late}))
    clock[0] += 299
    assert requests() == [20, 20, 20, 20]  # both kept: today's for its TTL
    clock[0] += 1
    assert requests() == [20, 20, 25, 25]  # today priced again; yesterday's figures are final


@pytest.mark.parametrize("days", ["0", "91", "-3", "two", "1.5", ""])
def test_daily_series_refuses_days_out_of_range_with_400(client, days):
    got = client.get("/v1/cost/daily", params={"days": days})
    assert got.status_code == 400 and "from 1 to 90" in got.json()["detail"]["message"]
