"""Signals over a real store, and the runner's persistence across restarts (SQLite and PostgreSQL).

Time is injected: records carry timestamps around T0 and every cycle gets an explicit `now`.
"""

from __future__ import annotations

import numpy as np
import pytest
from collector_payloads import T0, event_dict, request_dict, sample_dict
from rule_dicts import acceptance_rule
from sqlalchemy import select

from specwatch.alerts.rules import parse_config
from specwatch.alerts.runner import AlertRunner
from specwatch.alerts.signals import StoreSignals
from specwatch.alerts.store import active_alerts, history
from specwatch.alerts.tables import alert_notifications, alert_rule_health
from specwatch.collector.ingest.store import Store
from specwatch.collector.reads.queries import Window
from specwatch.telemetry.schema import IngestBatch


def store(db, requests=(), samples=(), events=()) -> None:
    Store(db).insert(
        IngestBatch.model_validate({"requests": list(requests), "samples": list(samples), "events": list(events)})
    )


def drafted(i: int, accepted: int, drafted_tokens: int = 16, at: float | None = None, **extra) -> dict:
    """A request with 4 drafts of 4 tokens, `accepted` of them accepted (drafts fill in order, so
    position k counts the drafts that accepted more than k tokens)."""
    per_pos = [sum(1 for d in range(4) if min(4, max(0, accepted - 4 * d)) > k) for k in range(4)]
    return request_dict(
        i,
        started_at=T0 + i if at is None else at,
        num_drafts=4,
        num_draft_tokens=drafted_tokens,
        num_accepted_tokens=sum(per_pos),
        accepted_per_position=per_pos,
        **extra,
    )


def test_request_signals_match_numpy_over_the_window(db):
    rng = np.random.default_rng(0)
    accepted = rng.integers(0, 17, size=60)
    ttft = rng.gamma(2.0, 0.1, size=60)
    records = [
        drafted(i, int(a), ttft_s=float(t), instance=f"gpu-{i % 2}") for i, (a, t) in enumerate(zip(accepted, ttft))
    ]
    store(db, records + [drafted(100, 0, at=T0 - 400)])  # one outside the window
    source, now = StoreSignals(db), T0 + 60
    got = {s.labels: s for s in source.query("acceptance_rate", 300, ["instance"], now)}
    stddev = {s.labels: s for s in source.query("acceptance_stddev", 300, ["instance"], now)}
    p99 = {s.labels: s for s in source.query("ttft_p99", 300, ["instance"], now)}
    for k in (0, 1):
        key = (("instance", f"gpu-{k}"),)
        acc = np.array([r["num_accepted_tokens"] for r in records[k::2]], dtype=float)
        assert got[key].count == 30 and got[key].value == pytest.approx(acc.sum() / (16 * 30))
        assert stddev[key].value == pytest.approx(np.std(acc / 16))
        # from merged DDSketches: within their 1% relative accuracy of the exact quantile
        assert p99[key].value == pytest.approx(np.quantile(ttft[k::2], 0.99), rel=0.01)


def test_device_event_and_arm_signals(db):
    samples = [
        sample_dict(i, at=T0 + 5 * i, fragmentation=1.1 + 0.02 * i, util_draft=[0.1, 0.5, 0.2][i % 3])
        for i in range(12)
    ]
    ooms = [request_dict(200 + i, status="error", error="target:oom") for i in range(2)]
    events = [event_dict(i, kind="oom", detail={}) for i in range(3)]
    rng = np.random.default_rng(1)
    arms = [
        request_dict(
            300 + i,
            started_at=T0 + i,
            arm="spec" if i % 2 else "control",
            output_tokens=50,
            e2e_s=float(rng.normal(1.5 if i % 2 else 1.0, 0.05)),
        )
        for i in range(40)
    ]
    store(db, ooms + arms, samples, events)
    source, now = StoreSignals(db), T0 + 60
    (frag,) = source.query("fragmentation", 60, ["instance"], now)
    assert frag.value == pytest.approx(np.mean([1.1 + 0.02 * i for i in range(12)])) and frag.count == 12
    (swing,) = source.query("draft_util_swing", 300, ["instance", "device"], now)
    assert swing.value == pytest.approx(40.0) and dict(swing.labels) == {"instance": "gpu-0", "device": "cpu"}
    (oom,) = source.query("oom_count", 600, ["instance"], now)
    assert oom.value == 3  # 2 failed requests and 3 OOM events: the larger count
    (regression,) = source.query("spec_latency_regression", 900, [], now)
    assert regression.value == pytest.approx(0.5, abs=0.05) and regression.significant and regression.count == 20


RULES = {
    "evaluation": {"interval": "15s", "repeat_interval": "1h"},
    "rules": [acceptance_rule(summary="acceptance {{ $value }}")],
    "receivers": [{"name": "ops", "url": "http://127.0.0.1:9/unused"}],
}


def notifications(db) -> list[tuple[str, str]]:
    with db.connect() as conn:
        return [tuple(r) for r in conn.execute(select(alert_notifications.c.rule, alert_notifications.c.alert_status))]


def test_restart_neither_refires_nor_forgets(db):
    config = parse_config(RULES)
    store(db, [drafted(i, 4) for i in range(10)])  # acceptance 0.25
    table = [  # (now, expected state, notifications so far); a new runner (a restart) every cycle
        (T0 + 20, "pending", 0),
        (T0 + 50, "pending", 0),
        (T0 + 80, "firing", 1),
        (T0 + 95, "firing", 1),
        (T0 + 400, "inactive", 2),  # the bad requests left the 5-minute window: resolved, sent once
        (T0 + 415, "inactive", 2),
    ]
    for now, expected, sent in table:
        runner = AlertRunner(db, config)
        runner.cycle(now)
        runner.close()
        (alert,), _ = active_alerts(db, include_resolved=True)
        assert (alert.state, len(notifications(db))) == (expected, sent), f"now={now}"
    assert notifications(db) == [("SpecAcceptanceLow", "firing"), ("SpecAcceptanceLow", "resolved")]
    moves = [(t["from_state"], t["to_state"]) for t in reversed(history(db, Window(T0, T0 + 1000))["transitions"])]
    assert moves == [("inactive", "pending"), ("pending", "firing"), ("firing", "inactive")]


class FailingFor:
    """A signal source whose one signal fails (as a broken query would)."""

    def __init__(self, inner, broken: str) -> None:
        self.inner, self.broken = inner, broken

    def query(self, signal, window_s, group_by, now):
        if signal == self.broken:
            raise RuntimeError("relation does not exist")
        return self.inner.query(signal, window_s, group_by, now)


def test_a_failing_signal_records_its_error_and_the_others_go_on(db):
    rules = {
        "rules": [
            RULES["rules"][0] | {"for": "0s"},
            RULES["rules"][0] | {"name": "Broken", "signal": "ttft_p99", "op": ">", "threshold": 0.3},
        ]
    }
    store(db, [drafted(i, 4) for i in range(10)])
    runner = AlertRunner(db, parse_config(rules), source=FailingFor(StoreSignals(db), "ttft_p99"))
    report = runner.cycle(T0 + 20)
    assert report.errors == {"Broken": "RuntimeError: relation does not exist"}
    (alert,), health = active_alerts(db)
    assert alert.rule == "SpecAcceptanceLow" and alert.state == "firing"
    assert {h.rule: h.error for h in health} == {
        "Broken": "RuntimeError: relation does not exist",
        "SpecAcceptanceLow": None,
    }
    with db.connect() as conn:
        assert (
            conn.execute(select(alert_rule_health.c.duration_s).where(alert_rule_health.c.rule == "Broken")).scalar()
            >= 0
        )


def test_old_alert_history_expires_with_the_rollups_but_undelivered_notifications_stay(db):
    from specwatch.alerts.store import expire_history
    from specwatch.collector.tiers.rollups import apply_retention

    store(db, [drafted(i, 4) for i in range(10)])
    runner = AlertRunner(db, parse_config({**RULES, "rules": [RULES["rules"][0] | {"for": "0s"}]}))
    runner.cycle(T0 + 20)
    runner.close()
    assert len(history(db, Window(T0, T0 + 100))["transitions"]) == 2
    apply_retention(db, T0 + 3 * 86400, raw_retention_s=86400, rollup_retention_s=2 * 86400)
    assert len(history(db, Window(T0, T0 + 100))["transitions"]) == 2  # the collector alone keeps them
    apply_retention(db, T0 + 3 * 86400, 86400, 2 * 86400, expiries=(expire_history,))
    assert history(db, Window(T0, T0 + 100))["transitions"] == []
    assert notifications(db) == [("SpecAcceptanceLow", "firing")]  # never delivered: kept


def test_vllm_signals_per_source_from_real_scrapes(db):
    from fake_vllm import FakeVllm

    from specwatch.collector.ingest.vllm import Scraper

    rng = np.random.default_rng(3)
    for source, (low, high) in (("http://good:8000/metrics", (2, 4)), ("http://bad:8000/metrics", (0, 2))):
        vllm, scraper = FakeVllm(), Scraper(source, db, 15)
        scraper.observe(vllm.text(), at=T0)
        accepted = rng.integers(low, high, 50)  # of 3 draft tokens
        for a in accepted:
            vllm.observe_draft(int(a))
            vllm.observe_request(0.05, 1.0)
        scraper.observe(vllm.text(), at=T0 + 15)
        (sample,) = [
            s
            for s in StoreSignals(db).query("vllm_acceptance_rate", 300, ["source"], T0 + 30)
            if dict(s.labels)["source"] == source
        ]
        assert sample.value == pytest.approx(accepted.sum() / 150) and sample.count == 50
    rule = {
        "name": "VllmLow",
        "signal": "vllm_acceptance_rate",
        "op": "<",
        "threshold": 0.6,
        "window": "5m",
        "min_samples": 20,
        "group_by": ["source"],
    }
    runner = AlertRunner(db, parse_config({"rules": [rule]}))
    runner.cycle(T0 + 30)
    runner.close()
    (alert,), _ = active_alerts(db)
    assert alert.labels["source"] == "http://bad:8000/metrics" and alert.state == "firing"
