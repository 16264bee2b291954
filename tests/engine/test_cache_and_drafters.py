"""KV-cache crop correctness across accept/reject patterns, and each drafter's proposals."""

from __future__ import annotations

import random

import pytest
import torch

from specwatch.engine.decoder import HFDecoder, LlamaDecoder, forward_many
from specwatch.engine.drafters import NgramConfig, NgramDrafter, early_exit_drafter, model_drafter
from specwatch.engine.sampling import SamplingParams
from tests.engine.conftest import tiny_gpt2, tiny_llama

GREEDY = SamplingParams()


def full_logits(model, tokens: list[int]) -> torch.Tensor:
    with torch.inference_mode():
        return model(torch.tensor([tokens])).logits[0]


@pytest.mark.parametrize("make", [LlamaDecoder, HFDecoder], ids=["fast-llama", "transformers"])
def test_crop_then_extend_matches_a_full_recompute(target, make):
    """Random rounds of 'feed k tokens, keep a random prefix' leave the cache as if never rejected."""
    rng = random.Random(0)
    decoder = make(target)
    decoder.reset(400)
    committed = [rng.randrange(target.config.vocab_size) for _ in range(12)]
    decoder.forward(torch.tensor(committed[:-1]))
    for _ in range(40):
        proposal = [rng.randrange(target.config.vocab_size) for _ in range(rng.randint(0, 6))]
        fed = [committed[-1], *proposal]
        logits = decoder.forward(torch.tensor(fed))
        expected = full_logits(target, committed + proposal)[-len(fed) :]
        torch.testing.assert_close(logits, expected, atol=1e-4, rtol=1e-4)
        keep = rng.randint(0, len(proposal))
        decoder.crop(len(committed) + keep)
        committed += proposal[:keep] + [rng.randrange(target.config.vocab_size)]
        assert decoder.length == len(committed) - 1


def test_one_batched_pass_gives_each_sequence_its_own_logits(target):
    """Sequences at different lengths, fed 1..7 rows each in one pass, match a full recompute
    each; a later round after crops stays right (caches advance independently)."""
    rng = random.Random(1)
    vocab = target.config.vocab_size
    decoders = [LlamaDecoder(target) for _ in range(4)]
    committed = [[rng.randrange(vocab) for _ in range(rng.randint(2, 30))] for _ in decoders]
    for decoder, tokens in zip(decoders, committed):
        decoder.reset(200)
        decoder.forward(torch.tensor(tokens[:-1]))
    for _ in range(3):
        fed = [[tokens[-1]] + [rng.randrange(vocab) for _ in range(rng.randint(0, 6))] for tokens in committed]
        logits = forward_many(decoders, [torch.tensor(f) for f in fed])
        for decoder, tokens, rows, got in zip(decoders, committed, fed, logits):
            torch.testing.assert_close(got, full_logits(target, tokens + rows[1:])[-len(rows) :], atol=1e-4, rtol=1e-4)
            keep = rng.randint(0, len(rows) - 1)
            decoder.crop(len(tokens) + keep)
            tokens += rows[1 : 1 + keep] + [rng.randrange(vocab)]


def test_decoders_that_do_not_share_weights_are_not_batched(target, draft):
    big, small = LlamaDecoder(target), LlamaDecoder(draft)
    assert not big.shares_weights(small) and big.shares_weights(LlamaDecoder(target))
    for decoder in (big, small):
        decoder.reset(50)
    got = forward_many([big, small], [torch.tensor([5, 6, 7]), torch.tensor([8, 9])])
    torch.testing.assert_close(got[0], full_logits(target, [5, 6, 7]), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(got[1], full_logits(draft, [8, 9]), atol=1e-4, rtol=1e-4)


def test_generic_decoder_on_gpt2_crops_too():
    model = tiny_gpt2(seed=5)
    decoder = HFDecoder(model)
    decoder.reset(100)
    decoder.forward(torch.tensor([1, 2, 3, 4, 5, 6]))
    decoder.crop(3)
    logits = decoder.forward(torch.tensor([9, 8]))
    torch.testing.assert_close(logits, full_logits(model, [1, 2, 3, 9, 8])[-2:], atol=1e-4, rtol=1e-4)


def greedy_continuation(model, tokens: list[int], k: int) -> list[int]:
    out = list(tokens)
    for _ in range(k):
        out.append(int(full_logits(model, out)[-1].argmax()))
    return out[len(tokens) :]


def test_early_exit_proposals_are_the_truncated_models_greedy_tokens(target):
    truncated = tiny_llama(seed=0, layers=4)  # same seed: identical weights to the target
    truncated.model.layers = truncated.model.layers[:2]
    truncated.config.num_hidden_layers = 2
    drafter = early_exit_drafter(target, 2)
    drafter.begin(200)
    tokens = [3, 1, 4, 1, 5, 9, 2, 6]
    rng = random.Random(1)
    for _ in range(10):
        draft, probs = drafter.propose(tokens, 4, GREEDY, None)
        assert probs is None and draft == greedy_continuation(truncated, tokens, 4)
        keep = rng.randint(0, 4)
        drafter.rollback(len(tokens) + keep)
        tokens = tokens + draft[:keep] + [rng.randrange(256)]


def test_model_drafter_rejects_a_different_vocabulary(target):
    with pytest.raises(ValueError, match="vocabulary"):
        model_drafter(tiny_llama(seed=2, vocab=300), target, "other")


def test_early_exit_layer_count_is_checked(target):
    with pytest.raises(ValueError, match="layers"):
        early_exit_drafter(target, 99)


def test_ngram_prefers_the_longest_then_latest_match():
    drafter = NgramDrafter(NgramConfig(max_n=3, min_n=2))
    drafter.begin(100)
    tokens = [1, 2, 3, 10, 11, 7, 2, 3, 20, 21, 9, 1, 2, 3]
    # trigram (1, 2, 3) matched at the start beats the later bigram (2, 3) -> 20
    assert drafter.propose(tokens, 2, GREEDY, None) == ([10, 11], None)
    assert drafter.propose([5, 6, 7, 8], 4, GREEDY, None) == ([], None)  # no match: no draft


def test_ngram_draft_is_capped_and_follows_new_tokens():
    drafter = NgramDrafter()
    drafter.begin(100)
    tokens = [4, 5, 6, 7, 8, 9, 4, 5]
    assert drafter.propose(tokens, 3, GREEDY, None)[0] == [6, 7, 8]
    tokens += [6, 1, 4, 5]  # (4, 5) now last followed 6 at index 8 -> continuation [6, 1, 4]
    assert drafter.propose(tokens, 3, GREEDY, None)[0] == [6, 1, 4]
