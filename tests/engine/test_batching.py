"""Concurrent requests share one target forward per round, and stay exactly what each would be alone."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
from engine_harness import BackgroundServer

import specwatch.engine.scheduler as scheduler_module
from specwatch.engine.engine import GenerateRequest
from specwatch.engine.policy import PolicyConfig
from specwatch.engine.scheduler import SchedulerConfig

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

    def spy(decoders, tokens, keep=None):
        sizes.append(len(decoders))
        return real(decoders, tokens, keep)

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


def solo(engine, prompt: str, max_tokens: int = 40) -> str:
    return engine.generate(GenerateRequest(prompt=prompt, max_tokens=max_tokens, drafter=None)).text


def test_batched_rounds_give_each_request_its_plain_greedy_text(bundled_engine, batch_sizes):
    texts, records = run_concurrently(bundled_engine, SchedulerConfig(slots=4))
    assert max(batch_sizes) >= 2, "the requests never shared a target forward"
    assert texts == [solo(bundled_engine, prompt) for prompt, _ in PROMPTS]
    assert {r.mode for r in records} == {"speculative", "autoregressive"} and all(r.status == "ok" for r in records)


def test_a_failed_batched_forward_falls_back_to_one_forward_per_request(bundled_engine, monkeypatch):
    calls = []

    def failing(decoders, tokens, keep=None):
        calls.append(len(decoders))
        raise RuntimeError("simulated failure of the shared forward")

    monkeypatch.setattr(scheduler_module, "forward_many", failing)
    texts, records = run_concurrently(bundled_engine, SchedulerConfig(slots=4))
    assert calls, "the batched path was never tried"
    assert texts == [solo(bundled_engine, prompt) for prompt, _ in PROMPTS]
    assert all(r.status == "ok" and r.retries == 0 and r.error is None for r in records)


LONG_PROMPT = (
    "Read the notes, then answer. Notes: the collector stores one record per request; rollups run each minute; "
    "alerts read the rollups; the gateway proxies to vLLM and records what it scraped. Question: which part "
    "reads the rollups, and how often are they computed?"
)


def decode_while_a_prompt_arrives(server, first_tokens: int, late_tokens: int) -> tuple[str, str]:
    """PROMPTS[1] streams; once its first token is out, LONG_PROMPT arrives: both texts (greedy, no drafter)."""
    client = server.client()
    first = client.completions.create(
        model=None,
        prompt=PROMPTS[1][0],
        max_tokens=first_tokens,
        temperature=0,
        stream=True,
        extra_body={"drafter": "none"},
    )
    pieces = [next(iter(first)).choices[0].text]  # it decodes now
    with ThreadPoolExecutor(1) as pool:
        late = pool.submit(
            lambda: client.completions.create(
                model=None, prompt=LONG_PROMPT, max_tokens=late_tokens, temperature=0, extra_body={"drafter": "none"}
            )
        )
        pieces += [chunk.choices[0].text for chunk in first]
        return "".join(pieces), late.result().choices[0].text


def test_a_prompt_arriving_mid_generation_rides_in_chunks_beside_the_decoding_request(bundled_engine, monkeypatch):
    """While one request decodes, a new one's prompt is fed `prefill_chunk` tokens a round in the same
    forward (its last row's logits kept): both texts stay what each would be alone."""
    forwards: list[tuple[list[int], list[int]]] = []  # (rows, keep) of every batched forward
    real = scheduler_module.forward_many

    def spy(decoders, tokens, keep=None):
        forwards.append(([len(t) for t in tokens], list(keep)))
        return real(decoders, tokens, keep)

    monkeypatch.setattr(scheduler_module, "forward_many", spy)
    with BackgroundServer(bundled_engine, SchedulerConfig(slots=2, prefill_chunk=8), ALWAYS_SPECULATE) as server:
        first, late = decode_while_a_prompt_arrives(server, 48, 16)
    chunked = [(rows, keep) for rows, keep in forwards if 1 in keep and 0 in keep]
    assert len(chunked) >= 3, f"the prompt never rode in chunks beside the decoding request: {forwards}"
    assert all(rows[keep.index(1)] <= 8 for rows, keep in chunked)
    assert first == solo(bundled_engine, PROMPTS[1][0], 48)
    assert late == solo(bundled_engine, LONG_PROMPT, 16)
    late_record = max(server.records, key=lambda r: r.prompt_tokens)
    assert late_record.ttft_s is not None and late_record.device_s_source == "engine"  # its chunks split by rows


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


def test_verification_rounds_run_on_the_batch_threads_and_a_riding_prompt_on_all(bundled_engine, monkeypatch):
    """Several requests verified together take `batch_threads` (--batch-threads, engine/threads.py); a
    forward with a prompt chunk riding in it takes `threads`, and the count is restored after each."""
    threads = bundled_engine.threads
    monkeypatch.setattr(bundled_engine, "batch_threads", 2 if threads == 1 else 1)
    monkeypatch.setattr(bundled_engine, "cpu_share", None)  # fixed counts (no CpuShare): as with --threads
    seen: list[tuple[list[int], int]] = []  # (keep, threads) of every batched forward
    real = scheduler_module.forward_many

    def spy(decoders, tokens, keep=None):
        seen.append((list(keep), torch.get_num_threads()))
        return real(decoders, tokens, keep)

    monkeypatch.setattr(scheduler_module, "forward_many", spy)
    with BackgroundServer(bundled_engine, SchedulerConfig(slots=2, prefill_chunk=8), ALWAYS_SPECULATE) as server:
        first, _ = decode_while_a_prompt_arrives(server, 40, 24)
    riding = [n for keep, n in seen if any(keep)]
    verifying = [n for keep, n in seen if not any(keep)]
    assert riding and verifying, f"no forward of both kinds: {seen}"
    assert set(riding) == {threads} and set(verifying) == {bundled_engine.batch_threads}
    assert first == solo(bundled_engine, PROMPTS[1][0], 40)
