"""Device time per request: every second the scheduler counts as busy is charged to a request
(a batched forward split by token rows, a request's own steps whole), so they add up to busy time."""

from __future__ import annotations

import asyncio

import pytest

from engine.engine import GenerateRequest, GenerateResult
from engine.policy import Policy, PolicyConfig
from engine.scheduler import Scheduler, SchedulerConfig, split_by_rows

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


def test_device_time_of_eight_concurrent_requests_adds_up_to_the_schedulers_busy_time(bundled_engine):
    scheduler = Scheduler(bundled_engine, SchedulerConfig(slots=8, batch=True), Policy(ALWAYS_SPECULATE))
    requests = [
        GenerateRequest(prompt=prompt, max_tokens=32, drafter=drafter, gamma=4 if drafter else 0)
        for prompt, drafter in PROMPTS
    ]
    scheduler.start()
    try:
        records = [result.record for result in asyncio.run(_finish_all(scheduler, requests))]
    finally:
        scheduler.stop()
    assert {r.mode for r in records} == {"speculative", "autoregressive"} and all(r.status == "ok" for r in records)
    assert max(r.load_at_admission for r in records) > 0.5, "the requests never ran together"
    charged = sum(r.device_s for r in records)
    busy = scheduler.busy.target_s + scheduler.busy.draft_s
    print(f"\nconcurrency 8: sum device_s {charged:.6f} s, busy {busy:.6f} s, {100 * (charged - busy) / busy:+.2e} %")
    assert charged == pytest.approx(busy, rel=0.02)
    for record in records:
        assert record.device_s_source == "engine"
        assert 0 < record.device_s < record.e2e_s, record
    # sharing forwards: together the requests used less device time than the sum of their wall times
    assert charged < sum(r.e2e_s for r in records)


def test_a_request_served_alone_is_charged_the_time_of_its_steps(bundled_engine):
    record = bundled_engine.generate(GenerateRequest(prompt="Name three primary colours.", max_tokens=8)).record
    assert record.device_s_source == "engine"
    assert record.verify_s <= record.device_s <= record.e2e_s
