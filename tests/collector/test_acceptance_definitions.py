"""Acceptance definitions beside the mean (telemetry/ratios.py): conditional acceptance at position 0 and
mean acceptance length / (k + 1), from request records and from vLLM scrapes, and why a threshold needs
its definition named: the mean falls as k grows where position-0 acceptance does not."""

from __future__ import annotations

import pytest
from collector_payloads import T0, plain_request_dict, request_dict
from fake_vllm import FakeVllm

from specwatch.alerts.signals import StoreSignals
from specwatch.collector.ingest.store import Store
from specwatch.collector.ingest.vllm import Scraper, vllm_signals
from specwatch.collector.reads.queries import Window
from specwatch.telemetry import ratios
from specwatch.telemetry.schema import IngestBatch


def drafts_at(p: float, k: int, drafts: int = 1000) -> list[int]:
    """Per-position accepted counts of `drafts` drafts of k tokens, each token accepted with probability p
    given the earlier ones were (the expected counts: position i reached by p^(i+1) of the drafts)."""
    return [round(drafts * p ** (i + 1)) for i in range(k)]


@pytest.mark.parametrize("k", [2, 8])
def test_position_0_keeps_its_meaning_as_k_grows_where_the_mean_does_not(k):
    per_pos = drafts_at(0.8, k)
    accepted, drafts = sum(per_pos), 1000
    assert ratios.conditional_acceptance(per_pos[0], drafts) == pytest.approx(0.8)
    mean = ratios.acceptance_rate(accepted, drafts * k)
    assert mean == pytest.approx({2: 0.72, 8: 0.4164}[k], abs=1e-3)  # 0.6 passes at k = 2, fails at k = 8
    assert ratios.acceptance_length_ratio(accepted, drafts, k) == pytest.approx((1 + accepted / drafts) / (k + 1))


def test_ratios_say_none_without_evidence():
    assert ratios.conditional_acceptance(0, 0) is None
    assert ratios.acceptance_length_ratio(0, 0, 4) is None and ratios.acceptance_length_ratio(3, 2, 0) is None


def test_conditional_acceptance_from_records_per_instance(db):
    records = [
        request_dict(0, instance="a", accepted_per_position=[4, 3, 2, 1], num_accepted_tokens=10),
        request_dict(1, instance="a", accepted_per_position=[2, 1, 0, 0], num_accepted_tokens=3),
        request_dict(2, instance="b", accepted_per_position=[1, 0, 0, 0], num_accepted_tokens=1),
        plain_request_dict(3, instance="b"),
    ]
    Store(db).insert(IngestBatch.model_validate({"requests": records}))
    got = {
        dict(r.labels)["instance"]: (r.value, r.count)
        for r in StoreSignals(db).query("conditional_acceptance", 300, ["instance"], T0 + 60)
    }
    assert got == {"a": (6 / 8, 2), "b": (1 / 4, 1)}  # 4 drafts per request; the plain one drafted nothing


def test_conditional_acceptance_and_length_ratio_from_vllm_scrapes(db):
    vllm, scraper = FakeVllm(gamma=3), Scraper("http://vllm:8000/metrics", db, 15)
    scraper.observe(vllm.text(), at=T0)
    for accepted in (3, 2, 0, 1, 0):
        vllm.observe_draft(accepted)
    scraper.observe(vllm.text(), at=T0 + 15)
    got = vllm_signals(db, Window(T0, T0 + 30))
    assert got.conditional_acceptance == pytest.approx(3 / 5)  # drafts whose first token was accepted
    assert got.acceptance_length_ratio == pytest.approx((1 + 6 / 5) / 4)
    (reading,) = StoreSignals(db).query("vllm_conditional_acceptance", 300, ["source"], T0 + 30)
    assert reading.value == pytest.approx(3 / 5)
