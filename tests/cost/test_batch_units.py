"""Per-request units at batch b, the crossover per group with its intervals, and the model's calibration
(issue 52: build items 4 and 9, the audit's b = 16 case).

The b = 16 case: 16 requests in lockstep on one device. A plain step is one forward of 16 (80 ms): each
request gets a token for 80 / 16 = 5 ms of device time. A speculative round: each request drafts 4 tokens
alone (4 ms each, the engine drafts request by request), then one verify forward of 16 x 5 rows (120 ms),
and each request keeps E tokens. Counting the device's seconds directly gives the ratio; the model must
say the same, not the 1.6x that setting one request's drafting against the whole batched forward gives.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from specwatch.collector.reads.curve_reads import CurvePoint, StoredCurve
from specwatch.cost.breakeven import break_even, tokens_per_round
from specwatch.cost.calibration import calibrate, times_at
from specwatch.cost.concurrency import ConcurrencyRow, crossing
from specwatch.cost.inputs import load_prices
from specwatch.cost.model import CostInputs, ModeMeasure

B, GAMMA, T_PLAIN, T_VERIFY, T_DRAFT, ALPHA = 16, 4, 0.080, 0.120, 0.004, 0.7
CURVE = StoredCurve(
    "gpu-0",
    0.0,
    (CurvePoint(1, 1.0, 0.030, 10), CurvePoint(1, 5.0, 0.034, 10))
    + (CurvePoint(B, 1.0, T_PLAIN, 900), CurvePoint(B, 5.0, T_VERIFY, 900)),
)


def _arm(mode: str, **more) -> ModeMeasure:
    return ModeMeasure(mode, "ngram" if mode == "speculative" else None, 1000, 1_000_000, 86_400.0, 100.0, **more)


def test_at_batch_16_the_model_counts_each_requests_share_of_the_forward_and_its_own_drafting():
    e = tokens_per_round(ALPHA, GAMMA)
    drafts = 1000
    spec = _arm(
        "speculative",
        drafts=drafts,
        draft_tokens=GAMMA * drafts,
        accepted_tokens=round((e - 1) * drafts),
        draft_s=GAMMA * drafts * T_DRAFT,
        verify_s=30.0,
    )
    arms = (_arm("autoregressive", verify_s=20.0), spec)
    (found,) = break_even(CostInputs(arms, load_prices(), "H100-SXM", step_curves=(CURVE,)))
    assert found.batch == B and found.draft_cost_ratio == pytest.approx(T_DRAFT * B / T_VERIFY)
    # the device's own seconds for 16 requests x n tokens: plain n steps of 80 ms; speculative n / E rounds
    # of 16 x 4 serial drafts of 4 ms and one 120 ms verify
    n = 1000.0
    plain_device_s = n * T_PLAIN
    spec_device_s = n / e * (B * GAMMA * T_DRAFT + T_VERIFY)
    counted = plain_device_s / spec_device_s
    assert counted == pytest.approx(0.59, abs=0.01)
    assert found.model_speedup == pytest.approx(counted, rel=1e-3)
    whole_forward = e * T_PLAIN / (T_VERIFY + GAMMA * T_DRAFT)  # the old mix of units
    assert whole_forward > 1.5 and found.model_speedup < 0.6
    assert found.speedup_alpha is None or found.speedup_alpha > ALPHA  # does not pay at this acceptance


def _level(level: int, mode: str, usd: float, low: float | None, high: float | None, **more) -> ConcurrencyRow:
    return ConcurrencyRow(level, mode, 50.0, 1e5, 100.0, 1.0, usd, None, True, low, high, **more)


def test_the_crossover_is_stated_only_where_the_intervals_clear():
    cheaper = (_level(1, "speculative", 1.0, 0.9, 1.1), _level(1, "autoregressive", 2.0, 1.8, 2.2))
    dearer = (_level(8, "speculative", 3.0, 2.8, 3.2), _level(8, "autoregressive", 2.0, 1.9, 2.1))
    overlap = (_level(16, "speculative", 3.0, 2.0, 4.0), _level(16, "autoregressive", 2.5, 2.2, 2.8))
    found = crossing(cheaper + dearer, "L4", "ngram")
    assert found.level == 8 and found.levels == ((1, "cheaper"), (8, "dearer"))
    found = crossing(cheaper + dearer + overlap, "L4", "ngram")
    assert found.level is None and "overlap at level(s) 16" in found.reason
    assert crossing(cheaper, "L4", "ngram").reason.startswith("no crossover: speculation costs no more")
    assert crossing((), "L4", "ngram").level is None


def test_calibration_puts_the_per_request_model_beside_the_measured_ratio():
    e = tokens_per_round(ALPHA, GAMMA)
    n, drafts = 12_000.0, 2_000.0
    accepted = (e - 1) * drafts
    plain_steps = n - drafts - accepted  # rounds the lookahead drafted nothing in (linear curve: the mean rows)
    spec_device = drafts * (T_VERIFY / B + GAMMA * T_DRAFT) + plain_steps * T_PLAIN / B
    plain_device = n * T_PLAIN / B
    more = dict(e2e_s=0.0, ok_tokens=n)
    rows = (
        ConcurrencyRow(
            B, "autoregressive", 50.0, n, plain_device * 1.1, 1.0, 1.0, None, True, e2e_s=2.0 * n, ok_tokens=n
        ),
        ConcurrencyRow(
            B, "speculative", 50.0, n, spec_device * 1.1, 1.0, 1.0, None, True,
            drafts=drafts, draft_tokens=GAMMA * drafts, accepted_tokens=accepted, draft_s=GAMMA * drafts * T_DRAFT,
            e2e_s=3.0 * n, ok_tokens=n,
        ),
        ConcurrencyRow(32, "autoregressive", 5.0, n, 1.0, 1.0, 1.0, None, True, **more),
        ConcurrencyRow(32, "speculative", 5.0, n, 1.0, 1.0, 1.0, None, True, drafts=1, draft_tokens=4, **more),
    )  # fmt: skip
    at16, at32 = calibrate(rows, [CURVE])
    assert at16.decode_ratio == pytest.approx(plain_device / spec_device)
    # both arms measured 10% over their decode steps: the rest (plain's 10%, per token) is added to both
    rest = 0.1 * plain_device / n
    assert at16.model_ratio == pytest.approx(1.1 * plain_device / n / (rest + spec_device / n))
    assert at16.measured_ratio == pytest.approx(plain_device / spec_device)
    assert at16.error == pytest.approx(at16.model_ratio / at16.measured_ratio - 1)
    assert at16.latency_speedup == pytest.approx(2.0 / 3.0)
    assert at16.gamma == pytest.approx(GAMMA) and at16.mean_acceptance_length == pytest.approx(e)
    assert at16.times_from == "the step-cost curve"  # these rows timed no forwards
    assert at32.model_ratio is None and "no step-cost curve at or around 32" in at32.why
    # the level's own forwards, where timed, stand before the curve: here the curve's times, doubled
    timed = (
        replace(rows[0], verify_s=1000 * 2 * T_PLAIN, forwards=1000),
        replace(rows[1], verify_s=(n - accepted) * 2 * (T_PLAIN + T_VERIFY) / 2, forwards=n - accepted),
    )
    (at16,) = calibrate(timed, [CURVE])
    assert at16.times_from == "the level's forwards" and at16.t_plain_s == pytest.approx(2 * T_PLAIN)
    assert at16.curve_ratio is not None and at16.model_ratio != pytest.approx(at16.curve_ratio)


def test_a_batch_size_between_measured_ones_is_read_between_them():
    assert times_at([CURVE], 16, 5.0) == pytest.approx((T_PLAIN, T_VERIFY))
    assert times_at([CURVE], 16, 3.0) == pytest.approx((T_PLAIN, (T_PLAIN + T_VERIFY) / 2))
    assert times_at([CURVE], 4, 5.0) == pytest.approx(
        (0.030 + (T_PLAIN - 0.030) * 3 / 15, 0.034 + (T_VERIFY - 0.034) * 3 / 15)
    )
    assert times_at([CURVE], 32, 5.0) is None and times_at([CURVE], 16, 6.0) is None
