"""Speculation inactive (collector.reads.speculation): drafts compared with generated tokens per instance
configured to speculate, from vLLM scrapes, request records and config events; the acceptance rules skip
a stale acceptance; /metrics and the query API say so. Time is injected: every read gets an explicit window."""

from __future__ import annotations

import pytest
from collector_payloads import T0, event_dict, request_dict
from fake_vllm import FakeVllm
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from specwatch.alerts.rules import load_config
from specwatch.alerts.runner import AlertRunner
from specwatch.alerts.signals import StoreSignals
from specwatch.alerts.store import active_alerts
from specwatch.collector.ingest.store import Store
from specwatch.collector.ingest.vllm import Scraper, parse, vllm_signals
from specwatch.collector.reads.queries import Window
from specwatch.collector.reads.speculation import speculation_activity
from specwatch.collector.speculation_gauges import SpeculationGauges
from specwatch.telemetry.schema import IngestBatch

SOURCE = "http://vllm:8000/metrics"


def store(db, requests=(), events=()) -> None:
    Store(db).insert(IngestBatch.model_validate({"requests": list(requests), "samples": [], "events": list(events)}))


def drafting_then_k0(db) -> Scraper:
    """A speculating vLLM: 100 drafts (1 of 3 tokens accepted: acceptance 0.33) up to T0 + 60, then every
    step at k = 0 (a schedule entry): 400 plain steps scraped at T0 + 120 and T0 + 180."""
    vllm, scraper = FakeVllm(), Scraper(SOURCE, db, 60)
    scraper.observe(vllm.text(), at=T0)
    for _ in range(100):
        vllm.observe_draft(1)
    for _ in range(30):
        vllm.observe_request(0.05, 1.0)
    scraper.observe(vllm.text(), at=T0 + 60)
    for at in (T0 + 120, T0 + 180):
        vllm.observe_plain_steps(200)
        for _ in range(15):
            vllm.observe_request(0.05, 1.0)
        scraper.observe(vllm.text(), at=at)
    scraper.vllm = vllm  # the test restores k on the same process
    return scraper


def test_a_k0_schedule_reads_inactive_with_when_it_stopped(db):
    drafting_then_k0(db)
    (before,) = speculation_activity(db, Window(T0, T0 + 61))
    assert before.instance == SOURCE and before.evidence == ("scrape",) and not before.inactive
    assert before.drafted_step_fraction == pytest.approx(100 / (200 - 100))
    (after,) = speculation_activity(db, Window(T0 + 70, T0 + 190))
    assert after.inactive and after.drafts == 0 and after.generated_tokens == 400
    assert after.drafted_step_fraction == 0.0 and after.last_drafted_at == T0 + 60


def test_restoring_k_clears_it(db):
    scraper = drafting_then_k0(db)
    for _ in range(150):
        scraper.vllm.observe_draft(2)
    scraper.observe(scraper.vllm.text(), at=T0 + 240)
    (a,) = speculation_activity(db, Window(T0 + 130, T0 + 250))
    assert not a.inactive and a.drafted_step_fraction == pytest.approx(150 / (200 + 450 - 300))
    assert a.last_drafted_at == T0 + 240


def test_the_stale_acceptance_neither_fires_nor_holds_an_alert(db):
    drafting_then_k0(db)
    (reading,) = StoreSignals(db).query("vllm_acceptance_rate", 300, ["source", "model"], T0 + 190)
    assert reading.value == pytest.approx(1 / 3) and reading.count >= 20  # below 0.6, enough requests...
    assert not reading.significant  # ...but the last drafts' figure: stale
    runner = AlertRunner(db, load_config())  # the shipped rules
    for now in (T0 + 190, T0 + 225, T0 + 260):
        runner.cycle(now)
    runner.close()
    alerts, _ = active_alerts(db)
    assert {(a.rule, a.state) for a in alerts} == {("SpeculationInactive", "firing")}
    (alert,) = alerts
    assert alert.labels["instance"] == SOURCE and alert.annotations["last_drafted_at"] == f"{T0 + 60:.0f}"


def test_a_vllm_without_speculation_is_not_inactive(db):
    vllm, scraper = FakeVllm(speculative=False), Scraper(SOURCE, db, 60)
    scraper.observe(vllm.text(), at=T0)
    vllm.observe_plain_steps(500)
    (row,) = scraper.observe(vllm.text(), at=T0 + 60)
    assert row["speculating"] is False and row["generation_tokens"] == 500
    assert speculation_activity(db, Window(T0, T0 + 120)) == []


def k0_request(i: int, at: float, **extra) -> dict:
    """A speculative-mode request that drafted nothing (every step at k = 0)."""
    counts = dict(num_drafts=0, num_draft_tokens=0, num_accepted_tokens=0, accepted_per_position=[0, 0, 0, 0])
    return request_dict(i, started_at=at, e2e_s=1.0, **{**counts, **extra})


def test_records_that_stop_drafting_read_inactive_and_their_acceptance_stale(db):
    drafting = [request_dict(i, started_at=T0 + i, e2e_s=1.0) for i in range(20)]
    store(db, drafting + [k0_request(100 + i, T0 + 200 + i) for i in range(40)])
    (a,) = speculation_activity(db, Window(T0 + 180, T0 + 300))
    assert a.evidence == ("records",) and a.inactive and a.generated_tokens == 40 * 64
    assert a.last_drafted_at == T0 + 19 + 1.0
    for signal in ("acceptance_rate", "acceptance_stddev"):
        for raw in (False, True):
            (reading,) = StoreSignals(db, raw=raw).query(signal, 300, ["instance"], T0 + 300)
            assert not reading.significant, (signal, raw)
    (fraction,) = StoreSignals(db).query("drafted_step_fraction", 120, ["instance"], T0 + 300)
    assert fraction.value == 0.0 and fraction.count == 40 * 64


def test_records_whose_draft_counts_are_unknown_say_nothing_about_drafting(db):
    unknown = dict(draft_counts_known=False, gamma=0, accepted_per_position=[])
    store(db, [k0_request(i, T0 + i, **unknown) for i in range(40)])
    assert speculation_activity(db, Window(T0, T0 + 60)) == []


def test_a_config_event_names_an_instance_configured_to_speculate(db):
    events = [
        event_dict(0, instance="up-a", kind="config", detail={"num_speculative_tokens": 3}),
        event_dict(1, instance="up-b", kind="config", detail={"num_speculative_tokens": 0}),
        event_dict(2, instance="gpu-1", kind="config", detail={"drafter": "ngram"}),
        event_dict(3, instance="gpu-2", kind="config", detail={"drafter": "ngram"}),
        event_dict(4, instance="gpu-2", kind="config", detail={"drafter": "none"}),  # the latest one counts
    ]
    store(db, events=events)
    found = speculation_activity(db, Window(T0, T0 + 60))
    assert [(a.instance, a.evidence, a.drafted_step_fraction, a.inactive) for a in found] == [
        ("gpu-1", ("config",), None, False),  # no traffic is not inactivity
        ("up-a", ("config",), None, False),
    ]


def test_metrics_export_the_fraction_the_flag_and_when_it_stopped(db):
    drafting_then_k0(db)
    registry = CollectorRegistry()
    SpeculationGauges(db, registry=registry, window_s=120, min_fraction=0.05, clock=lambda: T0 + 190)
    text = generate_latest(registry).decode()
    samples = {(s.name, s.labels["instance"]): s.value for f in text_string_to_metric_families(text) for s in f.samples}
    assert samples == {
        ("specwatch_drafted_step_fraction", SOURCE): 0.0,
        ("specwatch_speculation_inactive", SOURCE): 1.0,
        ("specwatch_speculation_last_draft_timestamp_seconds", SOURCE): T0 + 60,
    }


def test_query_api_answers_per_instance_and_refuses_a_bad_fraction(db, client):
    drafting_then_k0(db)  # the same database as the service
    got = client.get("/v1/speculation/activity", params={"start": T0 + 70, "end": T0 + 190})
    assert got.status_code == 200
    (a,) = got.json()["instances"]
    assert (a["instance"], a["inactive"], a["last_drafted_at"]) == (SOURCE, True, T0 + 60)
    bad = client.get("/v1/speculation/activity", params={"last": 60, "min_fraction": 2})
    assert bad.status_code == 422


def test_created_series_never_enter_a_sum_and_engine_ranks_add_up(db):
    """Every vLLM counter has a `<name>_created` sample (an epoch timestamp, ~1.8e9): it must be neither a
    counter value nor part of a delta. Data-parallel ranks are separate `engine` label values: summed."""
    vllm, scraper = FakeVllm(engines=2), Scraper(SOURCE, db, 60)
    scraper.observe(vllm.text(), at=T0)
    for engine, accepted in ((0, 2), (1, 1), (1, 3)):
        vllm.observe_draft(accepted, engine=engine)
    text = vllm.text()
    assert "vllm:spec_decode_num_drafts_created" in text and "vllm:generation_tokens_created" in text
    snaps = parse(text)
    assert {k: s.counters for k, s in snaps.items()} == {
        (vllm.labelsets[0][0], "0"): {"drafts": 1, "draft_tokens": 3, "accepted_tokens": 2, "generation_tokens": 3},
        (vllm.labelsets[0][0], "1"): {"drafts": 2, "draft_tokens": 6, "accepted_tokens": 4, "generation_tokens": 6},
    }
    rows = scraper.observe(text, at=T0 + 60)
    assert sorted(r["drafts"] for r in rows) == [1, 2] and max(r["generation_tokens"] for r in rows) == 6
    signals = vllm_signals(db, Window(T0, T0 + 120))
    assert (signals.drafts, signals.draft_tokens, signals.accepted_tokens, signals.generation_tokens) == (3, 9, 6, 9)
    (a,) = speculation_activity(db, Window(T0, T0 + 120))
    assert (a.drafts, a.generated_tokens, a.accepted_tokens) == (3, 9, 6)
