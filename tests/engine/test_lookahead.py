"""Cost-aware lookahead: the pure model on hand-computed curves, then the engine on the bundled model."""

from __future__ import annotations

import pytest

from specwatch.engine.engine import GenerateRequest, Run
from specwatch.engine.lookahead import Acceptance, CostCurve, LookaheadModel, expected_accepted
from specwatch.engine.speculative import SpeculativeDecoder


def model_with(p: float, seconds: dict[int, float], gamma: int = 8, positions: int = 200) -> LookaheadModel:
    """A model whose acceptance has settled at p per position and whose batch-1 curve is `seconds`."""
    model = LookaheadModel(gamma)
    model.costs.seconds[1] = dict(seconds)
    model.acceptance.trials = [float(positions)] * gamma
    model.acceptance.successes = [p * positions] * gamma
    return model


def linear(base: float, per_token: float, gamma: int = 8) -> dict[int, float]:
    return {n: base + per_token * (n - 1) for n in range(1, gamma + 2)}


def test_expected_accepted_is_the_sum_of_prefix_products():
    assert expected_accepted([0.5, 0.5, 0.5], 3) == pytest.approx(0.5 + 0.25 + 0.125)
    assert expected_accepted([0.9, 0.0, 1.0], 3) == pytest.approx(0.9)
    assert expected_accepted([0.9], 0) == 0.0


def test_high_acceptance_and_flat_cost_drafts_gamma():
    model = model_with(0.95, linear(0.010, 0.0))
    assert model.best(8, 1) == 8
    assert model.best(5, 1) == 5  # gamma stays the cap


def test_low_acceptance_stops_drafting():
    # p = 0.1 at 5% per token: k=1 gives 1.1 / 1.05 = 1.048 > 1, but the draft cost of a model drafter
    # (2 ms per token on a 10 ms step) makes k=0 the best
    assert model_with(0.1, linear(0.010, 0.0005)).best(8, 1) == 1
    model = model_with(0.1, linear(0.010, 0.0005))
    model.draft_s_per_token = 0.002
    assert model.best(8, 1) == 0
    # and with a steep verify cost, n-gram drafting (free) also stops
    assert model_with(0.1, linear(0.010, 0.002)).best(8, 1) == 0


def test_steep_cost_drafts_short():
    # p = 0.8, +50% per token: rate(k) = (1 + sum 0.8^i) / (1 + 0.5k) / 10 ms: k=1 -> 120, k=2 -> 122, k=3 -> 118
    model = model_with(0.8, linear(0.010, 0.005))
    assert model.best(8, 1) == 2
    rates = [model.rate(k, 1) for k in range(4)]
    assert rates[2] == pytest.approx((1 + 0.8 + 0.64) / 0.020, rel=0.02)
    assert model_with(0.8, linear(0.010, 0.003)).best(8, 1) == 3  # +30%: one more


def test_repeated_zero_rounds_reprobe():
    model = model_with(0.02, linear(0.010, 0.002))
    chosen = [model.choose(8, 1) for _ in range(24)]
    assert chosen == ([0] * 7 + [2]) * 3
    assert model.mean_chosen == pytest.approx(6 / 24)


def test_a_rejected_probe_doubles_the_wait_and_an_accepted_one_resets_it():
    model = model_with(0.02, linear(0.010, 0.002))

    def idle_then_probe(accepted: int) -> int:
        """Rounds until the next probe; the probe is then verified with `accepted` tokens kept."""
        rounds = 1
        while (k := model.choose(8, 1)) == 0:
            model.observe_round(0, 0, 1, 0.010, 0.0)
            rounds += 1
        model.observe_round(k, accepted, 1, 0.012, 0.0)
        return rounds

    assert [idle_then_probe(0) for _ in range(5)] == [8, 16, 32, 64, 64]
    model.acceptance.trials = [200.0] * 8  # the accepted probe must not move the estimate enough to draft on
    model.acceptance.successes = [4.0] * 8
    assert idle_then_probe(1) == 64 and model.wait == model.probe_every


def test_a_new_request_starts_from_the_drafters_shared_acceptance():
    shared = Acceptance(8, decay=1.0)
    for _ in range(200):
        shared.observe(2, 0)  # the drafter's first token was rejected 200 times in a row
    model = LookaheadModel(8, shared=shared)
    model.costs.seconds[1] = linear(0.010, 0.002)
    assert model.probabilities()[0] < 0.05
    assert model.choose(8, 1) == 0  # no fresh prior of 0.6 to draft on
    assert LookaheadModel(8).probabilities()[0] == pytest.approx(0.6)


def test_acceptance_counts_positions_up_to_the_first_rejection():
    acc = Acceptance(4, decay=1.0, prior_weight=1e-9)
    acc.observe(4, 2)  # positions 0, 1 accepted, 2 rejected, 3 unseen
    acc.observe(4, 4)
    p = acc.probabilities()
    assert p[:3] == pytest.approx([1.0, 1.0, 0.5])
    assert p[3] == pytest.approx(1.0)
    with pytest.raises(ValueError):
        acc.observe(2, 3)


def test_acceptance_forgets_old_rounds():
    acc = Acceptance(2, decay=0.5)
    for _ in range(20):
        acc.observe(2, 2)
    assert acc.probabilities()[0] > 0.85
    for _ in range(10):
        acc.observe(2, 0)
    assert acc.probabilities()[0] < 0.25


def test_cost_curve_interpolates_extrapolates_and_scales_the_prior():
    curve = CostCurve()
    assert curve.cost(1, 5) == pytest.approx(1 + 0.05 * 4)  # relative prior before measurements
    curve.observe(1, 1, 0.010)
    assert curve.cost(1, 3) == pytest.approx(0.010 * (1 + 0.05 * 2))  # one length: the prior slope, scaled
    curve.observe(1, 5, 0.014)
    assert curve.cost(1, 3) == pytest.approx(0.012)  # between measured lengths: linear
    assert curve.cost(1, 9) == pytest.approx(0.018)  # beyond: the fitted slope
    assert curve.slope() == pytest.approx(0.001 / 0.010)
    curve.observe(1, 1, 0.020)  # exponentially weighted
    assert curve.seconds[1][1] == pytest.approx(0.010 + 0.2 * 0.010)
    curve.observe(1, 7, 0.050)  # a shape's first forward (kernel set-up) ...
    curve.observe(1, 7, 0.016)  # ... is replaced by a faster second one,
    curve.observe(1, 7, 0.026)  # then the weighting resumes
    assert curve.seconds[1][7] == pytest.approx(0.016 + 0.2 * 0.010)
    assert curve.cost(3, 1) == curve.cost(1, 1)  # an unmeasured batch size borrows the nearest measured
    with pytest.raises(ValueError):
        curve.observe(1, 0, 0.01)
    with pytest.raises(ValueError):
        curve.observe(0, 1, 0.01)


def test_cost_curve_reads_a_forward_at_its_own_batch_size_between_measured_sizes():
    """A forward of 6 requests is priced at 6: its own curve once measured, until then linear between the
    measured sizes around it (4 and 8), never the 5-8 average a bucket would give."""
    curve = CostCurve()
    for batch, plain, verify in ((4, 0.040, 0.100), (8, 0.060, 0.220)):
        curve.observe(batch, 1, plain)
        curve.observe(batch, 5, verify)
    assert not curve.measured(2) and curve.measured(6) and curve.measured(4)
    assert curve.cost(6, 1) == pytest.approx(0.050)
    assert curve.cost(6, 3) == pytest.approx((0.070 + 0.140) / 2)  # rows first, then batch size
    assert curve.cost(16, 1) == pytest.approx(0.060)  # beyond the largest measured size: the nearest
    curve.observe(6, 1, 0.045)
    assert curve.cost(6, 1) == pytest.approx(0.045)  # its own measurement wins
    assert not curve.measured(6)  # one length at 6: the rows' cost there is not measured yet


def test_bad_mode_is_refused(target):
    from specwatch.engine.decoder import make_decoder

    with pytest.raises(ValueError, match="adaptive must be one of"):
        SpeculativeDecoder(make_decoder(target), None, adaptive="sometimes")


def _run(engine, messages, adaptive: str, drafter: str | None, max_tokens: int, steady: bool = False):
    """`steady`: the rounds are priced by a fixed CPU curve, not by this machine's clock (see `_steady`)."""
    request = GenerateRequest(messages=messages, max_tokens=max_tokens, drafter=drafter, gamma=8)
    run = Run(engine, request, engine.default_slot)
    run.loop.adaptive = adaptive
    run.prefill()
    if steady:
        _steady(run.loop.model)
    while not run.finished:
        run.advance()
    return run


def _steady(model: LookaheadModel, step_s: float = 0.020) -> None:
    """Price `model`'s rounds by a fixed curve measured on a quiet CPU (a plain step `step_s`, each verified
    row 5% more, drafting 0.3 of a step a token), on a curve of its own: the choices then follow the drafts'
    acceptance alone, not the timing noise of a loaded machine or the shared curve of earlier requests."""
    model.costs = CostCurve()
    observe = model.observe_round

    def priced(drafted, accepted, batch, forward_s, draft_s, predicted=None):
        observe(drafted, accepted, batch, step_s * (1 + 0.05 * drafted), 0.3 * step_s * drafted, predicted)

    model.observe_round = priced


def test_open_chat_stops_drafting_and_stays_exact(bundled_engine):
    """Open chat: drafts that are rarely accepted are not worth their verify slots, so the lookahead falls
    to 0 (plain steps, a short re-probe every 8th round); greedy output stays exactly plain decoding's."""
    chat = [{"role": "user", "content": "What are three good habits for staying healthy? Answer in a short paragraph."}]
    plain = _run(bundled_engine, chat, "cost", None, 48)
    assert plain.result().record.mean_lookahead is None
    for drafter in ("ngram", "early-exit:4"):  # n-gram finds no match here: it stays a plain step anyway
        run = _run(bundled_engine, chat, "cost", drafter, 48, steady=True)
        assert run.generated == plain.generated, drafter
    chosen = run.loop.model.chosen  # early exit after 4 of 30 layers: its drafts are wrong on open chat
    late = chosen[len(chosen) // 2 :]
    assert sum(k == 0 for k in late) >= 0.75 * len(late), chosen
    record = run.result().record
    assert record.mean_lookahead == pytest.approx(sum(chosen) / len(chosen)) and record.mean_lookahead < 1.5


def test_repetitive_prompt_still_drafts_under_the_cost_lookahead(bundled_engine):
    text = "alpha beta gamma delta epsilon zeta eta theta iota kappa " * 6
    repeat = [{"role": "user", "content": f"Repeat the following text exactly, then stop.\n\n{text}"}]
    run = _run(bundled_engine, repeat, "cost", "ngram", 64)
    # how long it drafts follows real timings (noisy on a shared CPU; the choice itself is tested on fixed
    # curves above): here only that drafting goes on and is accepted
    assert run.loop.stats.num_drafts >= 2
    assert run.loop.stats.num_accepted_tokens / max(run.loop.stats.num_draft_tokens, 1) > 0.6


def test_in_a_batch_drafting_k_costs_what_k_more_rows_add_to_the_batchs_forward():
    model = model_with(0.3, linear(0.010, 0.005))  # alone, +50% per token: drafting at p = 0.3 does not pay
    assert model.best(8, 1) == 0
    model.costs.seconds[8] = {1.0: 0.100, 1.5: 0.104}  # 8 requests: 4 more rows cost 4% of the forward
    p = model.probabilities()
    assert model.rate(4, 8) == pytest.approx((expected_accepted(p, 4) + 1) / 0.104)
    assert model.best(8, 8) > 0


def test_a_drafter_sized_draft_is_trimmed_where_its_calibrated_estimates_stop_paying():
    model = LookaheadModel(8)
    model.costs.seconds[1] = {1: 0.040, 2: 0.050, 9: 0.080}  # a row costs 25% of a step, then ~4%
    sure, doubtful = [1.0, 1.0, 1.0], [0.2, 0.15]
    assert model.trim(sure) == 3  # certain tokens pay their rows
    assert model.trim(doubtful) == 0  # (1 + 0.2) / 0.050 < 1 / 0.040: a plain step is faster
    assert model.trim([1.0, 0.9, 0.15]) == 2  # the third row would cost more than its 0.15 token
    for _ in range(20):  # the drafter's estimates turn out 3x too high: they are scaled down
        model.observe_round(3, 1, 1, 0.0, 0.0, predicted=3.0)
    assert 0.3 < model.calibration.factor < 0.4
    assert model.trim([1.0]) == 1  # 1 + 1/3 tokens for 0.050 s still beats 1 for 0.040
    assert model.trim([0.6, 0.3]) == 0  # 0.23 and 0.11: no longer worth a row
    assert model.trim([]) == 0  # nothing matched: a plain step, not a round the lookahead chose idle
    assert model.idle_rounds == 1


def test_a_floor_keeps_tokens_the_drafter_doubts_out_of_a_drafter_sized_draft():
    costs = {1: 0.040, 2: 0.041, 9: 0.048}  # rows nearly free: the tokens/s optimum verifies doubtful tokens
    draft = [0.9, 0.9 * 0.3, 0.9 * 0.3 * 0.9]  # own chances 0.9, 0.3, 0.9
    for floor, kept in ((0.0, 3), (0.25, 3), (0.4, 1), (0.95, 0)):
        model = LookaheadModel(8, floor=floor)
        model.costs.seconds[1] = dict(costs)
        assert model.trim(draft) == kept, floor
    with pytest.raises(ValueError, match="draft floor"):
        LookaheadModel(8, floor=1.0)


def test_suffix_rounds_ask_gamma_and_verify_what_the_lookahead_keeps(bundled_engine):
    text = "alpha beta gamma delta epsilon zeta eta theta iota kappa " * 6
    repeat = [{"role": "user", "content": f"Repeat the following text exactly, then stop.\n\n{text}"}]
    run = _run(bundled_engine, repeat, "cost", "suffix", 64, steady=True)  # choices by acceptance, not clock noise
    stats, trimmed = run.loop.stats, run.loop.model.chosen
    assert len(trimmed) == stats.lookahead_rounds and sum(trimmed) == stats.lookahead_sum
    assert stats.num_draft_tokens == sum(trimmed)  # what was verified is what the lookahead kept
    assert max(trimmed) >= 4 and stats.num_accepted_tokens / stats.num_draft_tokens > 0.8
    assert run.loop.model.calibration.predicted > 0
