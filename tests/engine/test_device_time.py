"""Device time per request: every second the scheduler counts as busy is charged to a request
(a batched forward shared out by the step-cost curve, or by token rows before the curve has measured
rows; a request's own steps whole), so they add up to busy time."""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass

import pytest

import specwatch.engine.scheduler as scheduler_module
from specwatch.engine.device_time import ROW_SHARES, STEP_CURVE, split_by_rows, split_by_step_curve, split_forward
from specwatch.engine.drafters import NgramDrafter
from specwatch.engine.engine import GenerateRequest, GenerateResult
from specwatch.engine.lookahead import CostCurve
from specwatch.engine.policy import Policy, PolicyConfig
from specwatch.engine.scheduler import Scheduler, SchedulerConfig
from specwatch.workload import COPY, LONG_ANSWERS

ALWAYS_SPECULATE = PolicyConfig(load_off=100.0, load_on=99.0, min_acceptance=0.0)
REPEATING = "Repeat exactly: the quick brown fox jumps over the lazy dog, the quick brown fox jumps over the lazy dog."
PROMPTS = [
    (REPEATING, "ngram"),
    ("Name three primary colours.", None),
    ("def add(a, b):\n    return a + b\n\nRewrite add with type hints.", "ngram"),
    ("What is the capital of France?", None),
    ("List the days of the week: Monday, Tuesday, Wednesday, Thursday, Friday, Saturday, Sunday. Again:", "ngram"),
    ("Write one sentence about the sea.", None),
    ("Count: 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 1, 2, 3,", "ngram"),
    ("Why is the sky blue?", None),
]


def test_four_equal_requests_sharing_a_ten_second_forward_get_two_and_a_half_each():
    assert split_by_rows(10.0, [3, 3, 3, 3]) == [2.5, 2.5, 2.5, 2.5]


def test_a_forward_is_split_by_token_rows():
    assert split_by_rows(12.0, [1, 1, 1, 9]) == [1.0, 1.0, 1.0, 9.0]
    assert sum(split_by_rows(0.37, [1, 5, 2])) == pytest.approx(0.37, rel=1e-12)


@pytest.mark.parametrize("rows", [[], [0, 0], [2, -1]])
def test_a_forward_without_rows_cannot_be_split(rows):
    with pytest.raises(ValueError, match="token rows"):
        split_by_rows(1.0, rows)


async def _finish_all(scheduler: Scheduler, requests: list[GenerateRequest]) -> list[GenerateResult]:
    loop = asyncio.get_running_loop()
    tickets = [scheduler.submit(request, loop) for request in requests]
    return [await _result(ticket) for ticket in tickets]


async def _result(ticket) -> GenerateResult:
    while True:
        item = await asyncio.wait_for(ticket.events.get(), timeout=120)
        if isinstance(item, GenerateResult):
            return item
        if isinstance(item, Exception):
            raise item


def serve(scheduler: Scheduler, requests: list[GenerateRequest]) -> list[GenerateResult]:
    scheduler.start()
    try:
        return asyncio.run(_finish_all(scheduler, requests))
    finally:
        scheduler.stop()


def eight_slots(engine) -> Scheduler:
    return Scheduler(engine, SchedulerConfig(slots=8, batch=True), Policy(ALWAYS_SPECULATE))


def test_device_time_of_eight_concurrent_requests_adds_up_to_the_schedulers_busy_time(bundled_engine):
    scheduler = eight_slots(bundled_engine)
    requests = [
        GenerateRequest(prompt=prompt, max_tokens=32, drafter=drafter, gamma=4 if drafter else 0)
        for prompt, drafter in PROMPTS
    ]
    records = [result.record for result in serve(scheduler, requests)]
    assert {r.mode for r in records} == {"speculative", "autoregressive"} and all(r.status == "ok" for r in records)
    assert max(r.load_at_admission for r in records) > 0.5, "the requests never ran together"
    charged = sum(r.device_s for r in records)
    busy = scheduler.busy.target_s + scheduler.busy.draft_s
    print(f"\nconcurrency 8: sum device_s {charged:.6f} s, busy {busy:.6f} s, {100 * (charged - busy) / busy:+.2e} %")
    assert charged == pytest.approx(busy, rel=0.02)
    for record in records:
        assert record.device_s_source in (STEP_CURVE, ROW_SHARES)
        assert 0 < record.device_s < record.e2e_s, record
    # sharing forwards: together the requests used less device time than the sum of their wall times
    assert charged < sum(r.e2e_s for r in records)


def test_a_request_served_alone_is_charged_the_time_of_its_steps(bundled_engine):
    record = bundled_engine.generate(GenerateRequest(prompt="Name three primary colours.", max_tokens=8)).record
    assert record.device_s_source == "engine"
    assert record.verify_s <= record.device_s <= record.e2e_s


def measured_at_eight(one_row_each: float, four_draft_rows: float) -> CostCurve:
    """A step-cost curve that has measured batches of 8: plain, and with 4 draft rows more (12 rows)."""
    curve = CostCurve()
    curve.observe(8, 1.0, one_row_each)
    curve.observe(8, 1.5, four_draft_rows)
    return curve


def test_a_drafting_request_pays_the_plain_share_plus_the_marginal_of_its_draft_rows():
    # 8 requests: 0.100 s with one row each, 0.110 s with 4 draft rows more; this forward took 0.220 s
    shares = split_by_step_curve(0.22, [5, 1, 1, 1, 1, 1, 1, 1], measured_at_eight(0.100, 0.110))
    assert shares[1:] == pytest.approx([0.025] * 7)  # 0.22 * (0.100 / 8) / 0.110
    assert shares[0] == pytest.approx(0.025 + 0.020)  # + 0.22 * 0.010 / 0.110
    assert sum(shares) == pytest.approx(0.22, rel=1e-12)
    assert split_by_rows(0.22, [5, 1, 1, 1, 1, 1, 1, 1])[0] == pytest.approx(0.22 * 5 / 12)  # by rows: 0.092


def test_the_marginal_is_shared_by_the_draft_rows_each_request_added():
    curve = measured_at_eight(0.100, 0.110)  # beyond 12 rows: the fitted 0.020 s per extra row per request
    shares = split_by_step_curve(0.115, [3, 5, 1, 1, 1, 1, 1, 1], curve)  # 14 rows: 0.115 s by the curve
    plain = 0.100 / 8
    assert shares[2:] == pytest.approx([plain] * 6)
    assert [shares[0] - plain, shares[1] - plain] == pytest.approx([0.005, 0.010])  # 2 and 4 of the 6 extra rows


def test_a_forward_of_one_row_each_is_split_evenly_without_a_measurement():
    shares, rule = split_forward(0.3, [1, 1, 1], CostCurve())
    assert shares == pytest.approx([0.1, 0.1, 0.1]) and rule == STEP_CURVE


def test_draft_rows_are_split_by_rows_until_the_curve_has_measured_them():
    curve = CostCurve()
    curve.observe(8, 1.0, 0.1)  # one length at batch 8: what a draft row adds is not measured
    assert split_by_step_curve(1.2, [5, 1, 1, 1, 1, 1, 1, 1], curve) is None
    shares, rule = split_forward(1.2, [5, 1, 1, 1, 1, 1, 1, 1], curve)
    assert rule == ROW_SHARES and shares[0] == pytest.approx(0.5)


def test_a_forward_that_fed_a_prompt_chunk_is_split_by_rows_even_where_the_curve_has_measured():
    shares, rule = split_forward(1.0, [1, 1, 1, 1, 1, 1, 1, 249], measured_at_eight(0.100, 0.110), prompt=True)
    assert rule == ROW_SHARES and shares == pytest.approx([1 / 256] * 7 + [249 / 256])


def test_a_curve_that_reads_draft_rows_as_free_charges_them_nothing():
    shares = split_by_step_curve(0.8, [5, 1, 1, 1, 1, 1, 1, 1], measured_at_eight(0.100, 0.095))  # noise
    assert shares == pytest.approx([0.1] * 8)


@pytest.mark.parametrize("rows", [[], [0, 1]])
def test_every_request_in_a_forward_feeds_a_row(rows):
    with pytest.raises(ValueError, match="token row"):
        split_by_step_curve(1.0, rows, CostCurve())


@dataclass(frozen=True)
class Split:
    seconds: float
    rows: list[int]
    shares: list[float]
    rule: str
    prompt: bool  # a new request's prompt (chunk) rode in the forward
    base: float  # the curve's seconds for this batch with one row per request
    whole: float  # ... with these rows (at least base)


@pytest.fixture
def splits(monkeypatch) -> list[Split]:
    """Spy on the scheduler's split of each batched forward (the real one still runs), with the curve's reading."""
    seen: list[Split] = []
    real = scheduler_module.split_forward

    def spy(seconds, rows, curve, prompt=False):
        base, whole = curve.cost(len(rows), 1.0), curve.cost(len(rows), sum(rows) / len(rows))
        shares, rule = real(seconds, rows, curve, prompt)
        seen.append(Split(seconds, list(rows), shares, rule, prompt, base, max(whole, base)))
        return shares, rule

    monkeypatch.setattr(scheduler_module, "split_forward", spy)
    return seen


def chat(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def test_a_speculative_request_among_seven_plain_pays_its_plain_share_plus_the_measured_marginal(
    bundled_engine, splits
):
    mix = [GenerateRequest(messages=chat(COPY), max_tokens=40, drafter="ngram", gamma=4)]
    mix += [GenerateRequest(messages=chat(prompt), max_tokens=64, drafter=None, gamma=0) for prompt in LONG_ANSWERS]
    serve(eight_slots(bundled_engine), mix)  # the curve at batch 8 measures plain forwards and draft rows
    assert bundled_engine.step_costs.measured(8)
    splits.clear()
    spec, *plain = [result.record for result in serve(eight_slots(bundled_engine), mix)]
    assert spec.mode == "speculative" and spec.num_accepted_tokens > 0 and {r.mode for r in plain} == {"autoregressive"}
    # prompts that rode in a shared forward are split by rows; of the rest only the speculative request feeds draft rows
    assert all(s.rule == ROW_SHARES for s in splits if s.prompt)
    mixed = [s for s in splits if max(s.rows) > 1 and not s.prompt]
    assert len(mixed) >= 3 and {s.rule for s in mixed} == {STEP_CURVE}
    by_curve = by_rows = 0.0
    for s in mixed:
        b, i, total = len(s.rows), s.rows.index(max(s.rows)), sum(s.rows)
        plain_share, marginal = s.seconds * s.base / b / s.whole, s.seconds * (s.whole - s.base) / s.whole
        assert s.shares[i] == pytest.approx(plain_share + marginal, rel=1e-9)
        assert [x for j, x in enumerate(s.shares) if j != i] == pytest.approx([plain_share] * (b - 1), rel=1e-9)
        row_share = s.seconds * s.rows[i] / total  # what the row rule charged: (gamma + 1) / E times plain per token
        # less than that exactly where the measured curve says a draft row costs less than an average row
        if not math.isclose(s.whole / s.base, total / b, rel_tol=1e-6):
            assert (s.shares[i] < row_share) == (s.whole / s.base < total / b), s
        by_curve, by_rows = by_curve + s.shares[i], by_rows + row_share
    plain_per_token = sum(r.device_s for r in plain) / sum(r.output_tokens for r in plain)
    forwards = spec.output_tokens - spec.num_accepted_tokens  # output = accepted + target forwards
    curve = {round(x, 3): round(1e3 * t, 1) for x, t in sorted(bundled_engine.step_costs.seconds[8].items())}
    print(
        f"\nspec {1e3 * spec.device_s / spec.output_tokens:.1f} ms/token (by rows it would be "
        f"{1e3 * (spec.device_s - by_curve + by_rows) / spec.output_tokens:.1f}), plain {1e3 * plain_per_token:.1f}"
        f" ms/token; (gamma+1)/E = {5 * forwards / spec.output_tokens:.2f}"
        f"\nstep-cost curve, batches of 5-8, rows per request -> ms: {curve}"
    )


class OutOfMemoryOnThirdDraft(NgramDrafter):
    """A real n-gram drafter whose third proposal fails as a draft running out of memory does."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = 0

    def propose(self, tokens, k, params, generator):
        self.calls += 1
        if self.calls == 3:
            raise MemoryError("simulated: the draft ran out of memory")
        return super().propose(tokens, k, params, generator)


def test_a_speculative_failure_retried_plainly_is_recorded_as_speculative_work_with_a_retry(drafting_engine):
    canary = PolicyConfig(load_off=100.0, load_on=99.0, min_acceptance=0.0, canary_fraction=0.99)
    scheduler = Scheduler(drafting_engine, SchedulerConfig(slots=2), Policy(canary, seed=0))
    for slot in scheduler.slots:
        slot.drafters["ngram"] = OutOfMemoryOnThirdDraft()
    (result,) = serve(scheduler, [GenerateRequest(prompt=REPEATING, max_tokens=24, drafter="ngram", gamma=4)])
    record = result.record
    assert (record.status, record.retries, record.error) == ("ok", 1, "draft:oom")
    assert (record.mode, record.drafter, record.arm, record.mode_reason) == ("speculative", "ngram", "spec", "canary")
    # both attempts' device time is the request's: the records still add up to busy time
    assert record.device_s == pytest.approx(scheduler.busy.target_s + scheduler.busy.draft_s, rel=1e-9)
    # and the failed attempt's part is measured (cost's retries line): its prefill and two rounds, not half
    assert 0 < record.failed_device_s < record.device_s
    plain = drafting_engine.generate(GenerateRequest(prompt=REPEATING, max_tokens=24, drafter=None))
    assert result.text == plain.text
