"""The tuner's schedule against static k and vLLM's adaptive verification (cost.tuner_compare): the best one k
by hand, and what is said (never a made-up figure) about adaptive verification for each version and drafter."""

from __future__ import annotations

import pytest
from collector_payloads import T0, event_dict
from test_tuner_store import RULES, WINDOW, fill

from specwatch.cost.tuner import BucketPlan, Schedule
from specwatch.cost.tuner_compare import adaptive_note, best_static_k, compared, static_note
from specwatch.cost.tuner_data import recommend_from_store


def bucket(level: int, requests: float, curve: tuple[float, ...], k: int, today_k: int = 2) -> BucketPlan:
    return BucketPlan(level, level, level, today_k, k, True, "", tokens_per_s=curve, requests=requests)


# batch 1 (10 requests) prefers k = 1, batch 2 (30 requests) k = 2
BUCKETS = (bucket(1, 10, (10.0, 20.0, 15.0), 1), bucket(2, 30, (40.0, 30.0, 50.0), 2))


def test_the_best_static_k_by_hand():
    assert best_static_k(list(BUCKETS)) == 2  # (150 + 1500) / 40 = 41.25 beats 32.5 (k = 0) and 27.5 (k = 1)
    note = static_note(Schedule(BUCKETS, ((1, 1, 1), (2, 2, 2)), 2))
    assert "k = 2 at 41.2 tok/s" in note and "this schedule 42.5 tok/s (1.030x of it)" in note
    assert note.startswith("against static k (predicted") and "today's k 41.2 tok/s" in note


def test_no_bucket_with_data_gives_no_static_comparison():
    assert static_note(Schedule((bucket(1, 0, (), 0),), ((1, 1, 0),), 0)) is None


@pytest.mark.parametrize(
    ("version", "drafter", "says"),
    [
        (None, "ngram", "version is not known"),
        ("0.28.0", "ngram", "not checked for vLLM 0.28.0"),
        ("0.32.0", "ngram", "not for n-gram drafts (vLLM 0.32.0; every vLLM checked"),
        ("0.33.0", "suffix", "drafter suffix cannot use it, so there is nothing to compare"),
        ("0.33.0", "dspark", "can run it for dspark on a GPU"),
        ("0.34.0", "suffix", "newer than the releases checked"),
        ("0.34.0", "ngram", "not for n-gram drafts"),  # not on main either
    ],
)
def test_adaptive_verification_is_compared_only_where_the_version_and_drafter_have_it(version, drafter, says):
    assert says in adaptive_note(version, drafter)


def test_recommendations_from_the_store_carry_both(db):
    fill(db, [event_dict(0, at=T0 - 5, kind="config", detail={"version": "0.32.0", "role": "upstream"})])
    plan = recommend_from_store(db, WINDOW, rules=RULES)
    static, adaptive = plan.comparisons
    assert static.startswith("against static k") and "not for n-gram drafts (vLLM 0.32.0;" in adaptive
    assert compared(plan).comparisons == plan.comparisons
