"""Tiny randomly initialised models built in the test, and the bundled SmolLM2 (loaded once)."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM


def tiny_llama(seed: int, vocab: int = 256, layers: int = 4, hidden: int = 64, init: float = 0.02) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        initializer_range=init,
        tie_word_embeddings=False,
        bos_token_id=None,
        eos_token_id=None,
        pad_token_id=None,
    )
    return LlamaForCausalLM(config).to(torch.float32).eval()


def on_one_and_two_threads(op, *args) -> tuple[torch.Tensor, torch.Tensor]:
    """`op(*args)` on one torch thread, then on two (the thread count restored after)."""
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = op(*args)
        torch.set_num_threads(2)
        return one, op(*args)
    finally:
        torch.set_num_threads(threads)


def tiny_gpt2(seed: int, vocab: int = 256, layers: int = 2) -> GPT2LMHeadModel:
    torch.manual_seed(seed)
    config = GPT2Config(
        vocab_size=vocab, n_embd=64, n_layer=layers, n_head=4, n_positions=512, bos_token_id=None, eos_token_id=None
    )
    return GPT2LMHeadModel(config).to(torch.float32).eval()


@pytest.fixture(scope="session")
def target() -> LlamaForCausalLM:
    return tiny_llama(seed=0)


@pytest.fixture(scope="session")
def draft() -> LlamaForCausalLM:
    return tiny_llama(seed=1, layers=2)


@pytest.fixture
def drafting_engine(bundled_engine, monkeypatch):
    """The bundled engine with lookahead 'fixed': every round drafts its gamma. Under the default 'cost'
    lookahead a round drafts only where the step-cost curve that earlier tests measured says extra verify
    rows pay for themselves; on a CPU where a several-row forward costs far more than a one-row one (the
    AVX2 machine: ~2x) that can be never, and a test about what happens when a draft fails needs drafts."""
    monkeypatch.setattr(bundled_engine, "config", dataclasses.replace(bundled_engine.config, lookahead="fixed"))
    return bundled_engine
