"""Concurrent requests share one target forward per round, and stay exactly what each would be alone."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from engine_harness import BackgroundServer

import engine.scheduler as scheduler_module
from engine.engine import GenerateRequest
from engine.policy import PolicyConfig
from engine.scheduler import SchedulerConfig

ALWAYS_SPECULATE = PolicyConfig(load_off=100.0, load_on=99.0, min_acceptance=0.0)
PROMPTS = [
    (
        "Repeat exactly: the quick brown fox jumps over the lazy dog, the quick brown fox jumps over the lazy dog.",
        "ngram",
    ),
    ("Name three primary colours.", "none"),
    ("def add(a, b):\n    return a + b\n\nRewrite add with type hints.", "ngram"),
    ("What is the capital of France?", "none"),
]


@pytest.fixture
def batch_sizes(monkeypatch) -> list[int]:
    """Spy on the scheduler's batched forward (the real one still runs): how many requests each call verified."""
    sizes: list[int] = []
    real = scheduler_module.forward_many

    def spy(decoders, tokens):
        sizes.append(len(decoders))
        return real(decoders, tokens)

    monkeypatch.setattr(scheduler_module, "forward_many", spy)
    return sizes


def run_concurrently(engine, config: SchedulerConfig) -> tuple[list[str], list]:
    with BackgroundServer(engine, config, ALWAYS_SPECULATE) as server:
        client = server.client()

        def ask(prompt_and_drafter):
            prompt, drafter = prompt_and_drafter
            return (
                client.completions.create(
                    model=None, prompt=prompt, max_tokens=40, temperature=0, extra_body={"drafter": drafter}
                )
                .choices[0]
                .text
            )

        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            texts = list(pool.map(ask, PROMPTS))
    return texts, server.records


def solo(engine, prompt: str) -> str:
    return engine.generate(GenerateRequest(prompt=prompt, max_tokens=40, drafter=None)).text


def test_batched_rounds_give_each_request_its_plain_greedy_text(bundled_engine, batch_sizes):
    texts, records = run_concurrently(bundled_engine, SchedulerConfig(slots=4))
    assert max(batch_sizes) >= 2, "the requests never shared a target forward"
    assert texts == [solo(bundled_engine, prompt) for prompt, _ in PROMPTS]
    assert {r.mode for r in records} == {"speculative", "autoregressive"} and all(r.status == "ok" for r in records)


def test_a_failed_batched_forward_falls_back_to_one_forward_per_request(bundled_engine, monkeypatch):
    calls = []

    def failing(decoders, tokens):
        calls.append(len(decoders))
        raise RuntimeError("simulated failure of the shared forward")

    monkeypatch.setattr(scheduler_module, "forward_many", failing)
    texts, records = run_concurrently(bundled_engine, SchedulerConfig(slots=4))
    assert calls, "the batched path was never tried"
    assert texts == [solo(bundled_engine, prompt) for prompt, _ in PROMPTS]
    assert all(r.status == "ok" and r.retries == 0 and r.error is None for r in records)


def test_batching_can_be_switched_off(bundled_engine, batch_sizes):
    texts, _ = run_concurrently(bundled_engine, SchedulerConfig(slots=4, batch=False))
    assert batch_sizes == []
    assert texts == [solo(bundled_engine, prompt) for prompt, _ in PROMPTS]


def test_auto_requests_run_what_the_selector_picks_per_scenario(bundled_engine):
    policy = PolicyConfig(load_off=100.0, load_on=99.0, candidates=("none", "ngram@4"))
    with BackgroundServer(bundled_engine, SchedulerConfig(slots=2), policy) as server:
        client = server.client()
        for _ in range(4):  # each candidate is tried twice before the selector exploits
            client.completions.create(
                model=None,
                prompt=PROMPTS[0][0],
                max_tokens=12,
                temperature=0,
                extra_body={"drafter": "auto", "tags": {"scenario": "grounded"}},
            )
        state = server.scheduler.policy.state["selector"]
    ran = sorted((r.drafter or "none", r.gamma) for r in server.records)
    assert ran == [("ngram", 4), ("ngram", 4), ("none", 0), ("none", 0)]
    assert {r.mode_reason for r in server.records} == {"selected"}
    assert {c: s["requests"] for c, s in state["grounded"].items()} == {"none": 2, "ngram@4": 2}
