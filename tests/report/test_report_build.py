"""The monthly report from a store with two months of synthetic telemetry: figures agree with
the rows stored, the previous month is compared, an empty month says so, and the
recommendation follows its decision table."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import numpy as np
import pytest
from collector_payloads import sample_dict, varied_request
from report_checks import check_html
from sqlalchemy import func, insert, select

from specwatch.alerts.tables import alert_actions, alert_transitions
from specwatch.collector.ingest.store import Store
from specwatch.collector.models import Request
from specwatch.collector.tiers.rollups import roll_up
from specwatch.cost.inputs import load_prices
from specwatch.report.build import (
    Headline,
    LoadBucket,
    build_report,
    last_month,
    load_knee,
    month_window,
    previous_month,
    recommend,
)
from specwatch.report.html import write_report
from specwatch.telemetry.schema import IngestBatch

MAY, JUNE = datetime(2026, 5, 3, tzinfo=UTC).timestamp(), datetime(2026, 6, 2, tzinfo=UTC).timestamp()
AFTER_JUNE = datetime(2026, 7, 1, 3, tzinfo=UTC).timestamp()


def _fill(db, start: float, n: int, seed: int) -> None:
    """n requests an hour apart from `start` (every 4th plain, errors and OOMs, acceptance grows with
    prompt length), with load at admission, estimated energy and drafting times."""
    rng = np.random.default_rng(seed)
    records = []
    for i in range(n):
        r = varied_request(i, rng)
        r.update(
            request_id=f"{seed}-{i}",
            started_at=start + 3600.0 * i,
            load_at_admission=float(rng.uniform(0, 2)),
            energy_j=float(rng.uniform(1, 10)),
            energy_source="estimate",
            draft_s=0.01,
            verify_s=0.2,
            tags={"scenario": "chat" if i % 3 else "grounded"},
        )
        records.append(r)
    samples = [sample_dict(i, at=start + 60 * i) for i in range(10)]
    Store(db).insert(IngestBatch.model_validate({"requests": records, "samples": samples}))


@pytest.fixture
def two_months(db):
    _fill(db, MAY, 200, 1)
    _fill(db, JUNE, 400, 2)
    roll_up(db, AFTER_JUNE)
    with db.begin() as conn:
        conn.execute(
            insert(alert_transitions),
            [
                {
                    "at": JUNE + 100,
                    "rule": "SpecAcceptanceLow",
                    "fingerprint": "f1",
                    "labels": {"instance": "gpu-0"},
                    "from_state": "pending",
                    "to_state": "firing",
                    "value": 0.4,
                },
                {
                    "at": JUNE + 900,
                    "rule": "SpecAcceptanceLow",
                    "fingerprint": "f1",
                    "labels": {"instance": "gpu-0"},
                    "from_state": "firing",
                    "to_state": "inactive",
                    "value": 0.7,
                },
            ],
        )
        conn.execute(
            insert(alert_actions),
            [
                {
                    "at": JUNE + 101,
                    "rule": "SpecAcceptanceLow",
                    "fingerprint": "f1",
                    "action": "fallback_autoregressive",
                    "instance": "gpu-0",
                    "outcome": "ok",
                    "detail": {},
                }
            ],
        )
    return db


def _stored(db, start: float, end: float, *where) -> int:
    with db.connect() as conn:
        return conn.scalar(
            select(func.count())
            .select_from(Request)
            .where(Request.started_at >= start, Request.started_at < end, *where)
        )


def test_report_figures_agree_with_the_store(two_months, tmp_path):
    db = two_months
    report = build_report(db, "2026-06", load_prices(), now=AFTER_JUNE)
    window = month_window("2026-06", AFTER_JUNE)
    assert (window.start, window.end) == (
        datetime(2026, 6, 1, tzinfo=UTC).timestamp(),
        datetime(2026, 7, 1, tzinfo=UTC).timestamp(),
    )
    assert not report.partial
    h = report.headline
    assert h.requests == _stored(db, window.start, window.end) == 400
    assert h.errors == _stored(db, window.start, window.end, Request.status == "error")
    assert h.ooms == _stored(db, window.start, window.end, Request.error.like("%oom%"))
    spec = _stored(db, window.start, window.end, Request.mode == "speculative")
    assert h.speculative_share == pytest.approx(spec / 400)
    with db.connect() as conn:
        drafted, accepted, out = conn.execute(
            select(
                func.sum(Request.num_draft_tokens),
                func.sum(Request.num_accepted_tokens),
                func.sum(Request.output_tokens),
            ).where(Request.started_at >= window.start, Request.started_at < window.end)
        ).one()
    assert h.acceptance_rate == pytest.approx(int(accepted) / int(drafted))  # int: PostgreSQL sums to numeric
    assert h.output_tokens == out
    assert sum(d.requests for d in report.daily) == 400 and len(report.daily) == 30
    assert {s.key: s.requests for s in report.traffic.by_mode} == {"speculative": spec, "autoregressive": 400 - spec}
    assert sum(x.requests for x in report.by_hour) == 400 and sum(x.ooms for x in report.by_hour) == h.ooms
    assert report.traffic.raw_requests == 400 and report.notes == ()
    assert report.latency.by == "mode"  # no A/B arms stored
    assert report.load.buckets and set(report.load.knee) == {"speculative", "autoregressive"}
    assert report.alerts.fired == {"SpecAcceptanceLow": 1} and report.alerts.resolved == 1
    assert report.alerts.actions == {"fallback_autoregressive: ok": 1} and h.alerts_fired == 1
    assert report.cost.tco.arms and h.net_monthly_benefit_usd == report.cost.tco.benefits[0].net_usd
    assert report.recommendation == recommend(h)

    # the previous month, computed from the store the same way
    assert report.previous_month == "2026-05" and report.previous.requests == 200
    deltas = {c.name: c for c in report.changes}
    assert deltas["requests"].delta == 200 and deltas["alerts_fired"].delta == 1

    html_path, json_path = write_report(report, tmp_path)
    assert html_path.name == "specwatch-report-2026-06.html" and json_path.name == "specwatch-report-2026-06.json"
    html = html_path.read_text()
    assert len(check_html(html)) >= 6  # daily, length, latency, load, hours, break-even, tornado
    assert "what changed since 2026-05" in html and 'class="estimate"' in html  # energy_source=estimate is labelled
    data = json.loads(json_path.read_text())
    assert data["headline"]["requests"] == 400 and data["previous"]["requests"] == 200
    assert data["recommendation"]["action"] in ("keep", "expand", "shrink", "disable")
    assert data["cost"]["tco"]["arms"][0]["energy_source"] == "estimate"


def test_empty_month_says_there_was_no_traffic(two_months, tmp_path):
    report = build_report(two_months, "2026-03", load_prices(), now=AFTER_JUNE)
    assert report.headline.requests == 0 and report.previous is None and report.changes == ()
    assert report.recommendation.rule == "not_in_use"
    html_path, json_path = write_report(report, tmp_path)
    html = html_path.read_text()
    check_html(html)
    assert "No traffic in 2026-03" in html and "no previous month" in html
    assert json.loads(json_path.read_text())["headline"]["requests"] == 0


def test_empty_store(db, tmp_path):
    report = build_report(db, "2026-06", load_prices(), now=AFTER_JUNE)
    check_html(write_report(report, tmp_path)[0].read_text())
    assert report.traffic.by_mode == () and report.daily and not any(d.requests for d in report.daily)


def test_raw_rows_past_retention_are_noted(two_months):
    with two_months.begin() as conn:  # as retention would: the rolled-up raw rows of early June are gone
        conn.execute(Request.__table__.delete().where(Request.started_at < JUNE + 10 * 86400))
    report = build_report(two_months, "2026-06", load_prices(), now=AFTER_JUNE)
    assert report.headline.requests == 400  # from the rollups
    assert 0 < report.traffic.raw_requests < 400 and "still held as raw rows" in report.notes[0]


def test_the_current_month_is_cut_at_now(two_months):
    now = JUNE + 5 * 86400
    report = build_report(two_months, "2026-06", load_prices(), now=now)
    assert report.partial and report.window.end == now
    assert report.headline.requests == _stored(two_months, month_window("2026-06", now).start, now)


@pytest.mark.parametrize("month", ["2026-13", "2026-00", "26-01", "2026-1", "", "2026-01-01", "abcd-ef"])
def test_bad_months(month):
    with pytest.raises(ValueError, match="YYYY-MM"):
        month_window(month)


def test_month_arithmetic():
    with pytest.raises(ValueError, match="not begun"):
        month_window("2026-08", now=AFTER_JUNE)
    assert previous_month("2026-01") == "2025-12" and previous_month("2026-10") == "2026-09"
    assert last_month(AFTER_JUNE) == "2026-06"
    assert (
        month_window("2026-12", now=datetime(2027, 2, 1, tzinfo=UTC).timestamp()).end
        == datetime(2027, 1, 1, tzinfo=UTC).timestamp()
    )


def _head(**changes) -> Headline:
    base = dict(
        requests=100,
        errors=0,
        ooms=0,
        output_tokens=1000,
        speculative_share=0.5,
        acceptance_rate=0.7,
        mean_acceptance_length=2.5,
        ttft_p50_s=0.1,
        ttft_p99_s=0.5,
        e2e_p99_s=2.0,
        speedup=1.5,
        speedup_p_value=0.001,
        net_monthly_benefit_usd=100.0,
        alerts_fired=0,
        measured_saving_usd=100.0,
    )
    return Headline(**{**base, **changes})


@pytest.mark.parametrize(
    "changes, action, rule",
    [
        ({"speculative_share": 0.0}, "keep", "not_in_use"),
        ({"speedup": 0.8}, "disable", "measured_slower"),
        ({"speedup": 0.8, "measured_saving_usd": 500.0}, "disable", "measured_slower"),
        ({"measured_saving_usd": None}, "keep", "not_priced"),
        ({"measured_saving_usd": -1.0}, "shrink", "faster_but_costs_more"),
        ({"measured_saving_usd": -1.0, "speedup_p_value": 0.2}, "disable", "no_gain_costs_more"),
        # assumed fixed costs (a net loss) never flip a measured saving
        ({"net_monthly_benefit_usd": -8300.0}, "expand", "pays_quietly"),
        ({}, "expand", "pays_quietly"),
        ({"alerts_fired": 2}, "keep", "pays_with_alerts"),
        ({"speedup_p_value": 0.2, "alerts_fired": 1}, "shrink", "unproven_with_alerts"),
        ({"speedup": 1.02}, "keep", "unproven_no_harm"),
    ],
)
def test_recommendation_table(changes, action, rule):
    verdict = recommend(_head(**changes))
    assert (verdict.action, verdict.rule) == (action, rule)


def test_load_knee_and_crossover():
    buckets = [
        LoadBucket("autoregressive", 0.0, 0.25, 10, 50.0, None),
        LoadBucket("autoregressive", 1.0, 1.5, 10, 45.0, None),
        LoadBucket("speculative", 0.0, 0.25, 10, 90.0, None),
        LoadBucket("speculative", 0.5, 0.75, 10, 75.0, None),
        LoadBucket("speculative", 1.0, 1.5, 10, 40.0, None),
    ]
    knee = load_knee(buckets)
    assert knee.knee == {"autoregressive": None, "speculative": 1.0}  # 40 < 0.8 x 90; 45 >= 0.8 x 50
    assert knee.crossover == 1.0  # 40 <= 45
    assert load_knee([]).knee == {} and load_knee([]).crossover is None


def test_the_report_names_a_decision_table_that_exists():
    """The report tells readers where its decision table is: that file holds that function."""
    import re
    from pathlib import Path

    import specwatch.report.html as report_html

    html = Path(report_html.__file__).resolve()
    named = re.search(r"decision table is <code>(\w+)</code> in <code>([\w/.]+)</code>", html.read_text())
    assert named, "the report no longer names its decision table"
    assert f"def {named[1]}(" in (html.parents[1] / named[2]).read_text()
