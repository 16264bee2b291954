"""The Acceptance page's read (`GET /v1/acceptance/definitions`): the mean, conditional acceptance at
position 0 and acceptance length / (k + 1) side by side, per k, with counts computed here by hand; and the
instances among the window's records whose acceptance is lossy or forced, with the setting that says so."""

from __future__ import annotations

import pytest
from collector_payloads import T0, event_dict, request_dict

from specwatch.collector.ingest.store import Store
from specwatch.collector.reads.acceptance_definitions import definitions
from specwatch.collector.reads.queries import Filters, Window
from specwatch.telemetry.schema import IngestBatch

# k = 2: 10 drafts, 8 first tokens accepted, 6 second; k = 8: the same first position, a long tail
AT_2 = dict(gamma=2, num_drafts=10, num_draft_tokens=20, num_accepted_tokens=14, accepted_per_position=[8, 6])
AT_8 = dict(
    gamma=8, num_drafts=10, num_draft_tokens=80, num_accepted_tokens=30, accepted_per_position=[8, 6, 5, 4, 3, 2, 1, 1]
)
WINDOW = Window(T0, T0 + 100)


def store(db, requests=(), events=()) -> None:
    Store(db).insert(IngestBatch.model_validate({"requests": list(requests), "events": list(events)}))


def test_position_zero_holds_where_the_mean_falls_with_k(db):
    store(db, [request_dict(0, **AT_2), request_dict(1, **AT_8), request_dict(2, instance="plain", **_plain())])
    found = definitions(db, WINDOW)
    at_2, at_8 = found.by_k
    assert (at_2.k, at_2.requests, at_2.drafts, at_2.first_position_accepted) == (2, 1, 10, 8)
    assert at_2.acceptance_rate == pytest.approx(14 / 20) and at_8.acceptance_rate == pytest.approx(30 / 80)
    assert at_2.conditional_acceptance == at_8.conditional_acceptance == pytest.approx(0.8)
    assert at_2.acceptance_length_ratio == pytest.approx((1 + 14 / 10) / 3)
    assert at_8.acceptance_length_ratio == pytest.approx((1 + 30 / 10) / 9)
    overall = found.overall
    assert (overall.k, overall.requests, overall.drafts) == (None, 2, 20)
    assert overall.conditional_acceptance == pytest.approx(16 / 20)
    assert overall.acceptance_rate == pytest.approx(44 / 100)
    assert overall.acceptance_length_ratio is None  # two k: no one ratio, see by_k
    assert found.flagged == []


def test_one_k_gives_the_overall_length_ratio_and_filters_apply(db):
    store(db, [request_dict(0, **AT_2), request_dict(1, instance="gpu-1", **AT_8)])
    found = definitions(db, WINDOW, Filters(instance="gpu-0"))
    assert found.overall.k == 2 and found.overall.acceptance_length_ratio == pytest.approx(0.8)


def test_nothing_drafted_reads_none_not_zero(db):
    store(db, [request_dict(0, **_plain())])
    found = definitions(db, WINDOW)
    assert found.by_k == [] and found.overall.requests == 0
    assert found.overall.conditional_acceptance is None and found.overall.acceptance_rate is None


def test_flagged_instances_among_the_records_are_named_with_the_setting(db):
    fly = {"speculative_config": {"method": "ngram", "rejection_sample_method": "fly"}}
    forced = {"env": {"SGLANG_SIMULATE_ACC_LEN": "3.2"}}
    events = [
        event_dict(0, instance="gpu-0", kind="config", detail=fly),
        event_dict(1, instance="absent", kind="config", detail=forced),  # no records here: not listed
    ]
    store(db, [request_dict(0, **AT_2), request_dict(1, instance="gpu-1", **AT_8)], events)
    (flag,) = definitions(db, WINDOW).flagged
    assert (flag.instance, flag.mode, flag.setting) == ("gpu-0", "lossy", "rejection_sample_method: fly")
    assert "looser test" in flag.why


def test_http_serves_it(client):
    sent = client.post("/v1/ingest", json={"requests": [request_dict(0, **AT_2)]})
    assert sent.status_code == 200, sent.text
    body = client.get("/v1/acceptance/definitions", params={"start": T0, "end": T0 + 100}).json()
    assert body["overall"]["conditional_acceptance"] == pytest.approx(0.8)
    assert body["by_k"][0]["k"] == 2 and body["flagged"] == []


def _plain() -> dict:
    return dict(
        mode="autoregressive", drafter=None, gamma=0, num_drafts=0, num_draft_tokens=0, num_accepted_tokens=0,
        accepted_per_position=[],
    )  # fmt: skip
