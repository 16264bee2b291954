"""Greedy speculative decoding must emit exactly what plain greedy decoding emits."""

from __future__ import annotations

import pytest
import torch

from specwatch.engine.decoder import _FUSED, HFDecoder, LlamaDecoder, cpu_prepack, make_decoder
from specwatch.engine.drafters import NgramDrafter, early_exit_drafter, model_drafter, truncated_copy
from specwatch.engine.engine import GenerateRequest
from specwatch.engine.sampling import SamplingParams
from specwatch.engine.speculative import SpeculativeDecoder
from specwatch.engine.suffix import SuffixDrafter
from tests.engine.conftest import tiny_gpt2

GREEDY = SamplingParams()


def run_loop(model, drafter, prompt: list[int], max_new: int, gamma: int, decoder=None) -> tuple[list[int], object]:
    loop = SpeculativeDecoder(decoder or make_decoder(model), drafter)
    loop.prefill(prompt, max_new, gamma, GREEDY)
    while not loop.finished:  # a round as the engine runs it: draft, one target forward, verify and commit
        loop.accept(loop.target.forward(loop.propose()), forward_s=0.0)
    return loop.tokens[len(prompt) :], loop.stats


def hf_greedy(model, prompt: list[int], max_new: int) -> list[int]:
    ids = torch.tensor([prompt])
    out = model.generate(
        ids,
        attention_mask=torch.ones_like(ids),
        max_new_tokens=max_new,
        min_new_tokens=max_new,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
    )
    return out[0, len(prompt) :].tolist()


def prompts(vocab: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(7)
    random_prompt = torch.randint(0, vocab, (40,), generator=g).tolist()
    repetitive = [5, 6, 7, 8, 9, 10, 11] * 6  # n-gram lookup finds matches here
    return [random_prompt, repetitive, [3]]


@pytest.mark.parametrize("kind", ["plain", "ngram", "suffix", "model", "early-exit"])
def test_tiny_llama_greedy_matches_plain_and_transformers(target, draft, kind):
    drafter = {
        "plain": None,
        "ngram": NgramDrafter(),
        "suffix": SuffixDrafter(),
        "model": model_drafter(draft, target, "tiny-draft"),
        "early-exit": early_exit_drafter(target, 2),
    }[kind]
    for prompt in prompts(target.config.vocab_size):
        expected = hf_greedy(target, prompt, 48)
        for gamma in (1, 3, 8):
            tokens, stats = run_loop(target, drafter, prompt, 48, gamma)
            assert tokens == expected, f"{kind} gamma={gamma} diverged"
            assert stats.num_accepted_tokens + stats.target_forwards == len(tokens)


def test_self_drafting_accepts_everything(target):
    """A draft identical to the target is always right: acceptance 1.0 and a bonus token per round."""
    tokens, stats = run_loop(target, model_drafter(target, target, "self"), [1, 2, 3], 40, 4)
    assert tokens == hf_greedy(target, [1, 2, 3], 40)
    assert stats.num_accepted_tokens == stats.num_draft_tokens > 0
    # every draft is accepted in full; only the last one is shortened to fit max_new_tokens (40 = 1 + 7 * 5 + 4)
    assert stats.accepted_per_position == [stats.num_drafts] * 3 + [stats.num_drafts - 1]
    assert stats.drafts_per_position == stats.accepted_per_position  # the short last draft never reached 3


def test_generic_transformers_path_matches(target):
    """Architectures without the fast path (GPT-2 here) decode through transformers' own forward."""
    gpt2, gpt2_draft = tiny_gpt2(seed=3), tiny_gpt2(seed=4, layers=1)
    assert isinstance(make_decoder(gpt2), HFDecoder)
    for prompt in prompts(gpt2.config.vocab_size):
        expected = hf_greedy(gpt2, prompt, 32)
        for drafter in (None, NgramDrafter(), SuffixDrafter(), model_drafter(gpt2_draft, gpt2, "gpt2-draft")):
            assert run_loop(gpt2, drafter, prompt, 32, 4)[0] == expected


def test_fast_decoder_is_used_and_shares_weights(target):
    first, second = LlamaDecoder(target), LlamaDecoder(target)
    assert first.layers[0].wqkv is second.layers[0].wqkv and first.lm_head is second.lm_head  # packed once
    fused = _FUSED[target.model.layers[0].self_attn.q_proj]["weight"]
    assert target.model.layers[0].self_attn.q_proj.weight.data_ptr() == fused.data_ptr()  # fused in place
    assert first.packed == cpu_prepack(torch.float32) and (first.layers[0].wqkv.packed is not None) == first.packed
    assert first.layers[0].wqkv.by_columns.is_contiguous()  # fp32 on CPU: one row times the input-major weight


BUNDLED_PROMPTS = [
    "Repeat this sentence exactly: The quick brown fox jumps over the lazy dog near the quiet river bank.",
    "Fix the bug in this function and return the corrected code:\n\ndef add(a, b):\n    return a - b\n",
    "Tell me something interesting about octopuses.",
]


@pytest.mark.parametrize("drafter", [None, "ngram", "suffix", "early-exit:6", "model:first-8-layers"])
def test_bundled_model_float32_matches_transformers(bundled_engine, drafter):
    model = bundled_engine.target.model
    if drafter == "model:first-8-layers":
        bundled_engine.add_drafter(drafter, model_drafter(truncated_copy(model, 8), model, "first-8-layers"))
    for text in BUNDLED_PROMPTS:
        request = GenerateRequest(messages=[{"role": "user", "content": text}], max_tokens=40, drafter=drafter, gamma=4)
        result = bundled_engine.generate(request)
        prompt_ids = bundled_engine.encode(request)
        ids = torch.tensor([prompt_ids])
        expected = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=40, do_sample=False)[
            0, len(prompt_ids) :
        ].tolist()
        assert result.token_ids == expected, f"{drafter} diverged on {text[:30]!r}"
