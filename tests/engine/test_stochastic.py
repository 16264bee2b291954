"""Speculative sampling must leave the target's distribution unchanged (Leviathan et al. 2023)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import chisquare

from specwatch.engine.decoder import make_decoder
from specwatch.engine.draft_head import HeadDrafter, new_head
from specwatch.engine.drafters import NgramDrafter, model_drafter
from specwatch.engine.sampling import SamplingParams, probabilities, verify_stochastic
from specwatch.engine.speculative import SpeculativeDecoder
from specwatch.engine.suffix import SuffixDrafter
from tests.engine.conftest import tiny_llama

VOCAB = 6
DRAWS = 10_000
PARAMS = SamplingParams(temperature=1.0)
# de Bruijn sequence B(6, 2): every bigram occurs, so n-gram lookup always finds a match
DE_BRUIJN = [
    0,
    0,
    1,
    0,
    2,
    0,
    3,
    0,
    4,
    0,
    5,
    1,
    1,
    2,
    1,
    3,
    1,
    4,
    1,
    5,
    2,
    2,
    3,
    2,
    4,
    2,
    5,
    3,
    3,
    4,
    3,
    5,
    4,
    4,
    5,
    5,
    0,
]


@pytest.fixture(scope="module")
def peaky_target():
    return tiny_llama(seed=11, vocab=VOCAB, layers=2, hidden=32, init=0.5)


def exact_joint(model, prompt: list[int]) -> np.ndarray:
    """p(t1) * p(t2 | t1) from the target itself, over all VOCAB x VOCAB pairs."""
    with torch.inference_mode():
        first = torch.softmax(model(torch.tensor([prompt])).logits[0, -1].float(), -1)
        joint = np.zeros((VOCAB, VOCAB))
        for t1 in range(VOCAB):
            second = torch.softmax(model(torch.tensor([prompt + [t1]])).logits[0, -1].float(), -1)
            joint[t1] = (first[t1] * second).numpy()
    return joint


def sampled_joint(model, drafter, prompt: list[int], decoder=None, **loop_options) -> tuple[np.ndarray, int]:
    counts, drafted = np.zeros((VOCAB, VOCAB)), 0
    # "fixed" by default: every round drafts, so every draw tests the verification rule (the cost-aware
    # default stops drafting for a drafter this random model rejects)
    loop = SpeculativeDecoder(decoder or make_decoder(model), drafter, **({"adaptive": "fixed"} | loop_options))
    for seed in range(DRAWS):
        loop.prefill(prompt, 3, 3, PARAMS, seed=seed)  # the round after the first token drafts 1 token
        loop.accept(loop.target.forward(loop.propose()), forward_s=0.0)  # one round
        t1, t2 = loop.tokens[len(prompt) : len(prompt) + 2]
        counts[t1, t2] += 1
        drafted += loop.stats.num_draft_tokens
    return counts, drafted


def assert_same_distribution(counts: np.ndarray, expected_probs: np.ndarray) -> None:
    expected = expected_probs.ravel() * counts.sum()
    observed = counts.ravel()
    keep = expected >= 5  # pool the rare cells so the chi-square approximation holds
    f_obs = np.append(observed[keep], observed[~keep].sum())
    f_exp = np.append(expected[keep], expected[~keep].sum())
    if f_exp[-1] == 0:
        f_obs, f_exp = f_obs[:-1], f_exp[:-1]
    result = chisquare(f_obs, f_exp * f_obs.sum() / f_exp.sum())
    assert result.pvalue > 0.01, f"chi-square p = {result.pvalue:.4g}"


@pytest.mark.parametrize("kind", ["model", "reduced-vocab", "feature-head", "ngram", "suffix"])
def test_speculative_sampling_keeps_target_distribution(peaky_target, kind):
    draft = tiny_llama(seed=12, vocab=VOCAB, layers=1, hidden=32, init=0.5)
    decoder = make_decoder(peaky_target)
    drafter = {
        "model": lambda: model_drafter(draft, peaky_target, "draft"),
        # a reduced draft vocabulary (EAGLE-3's): never proposes 0, 2 or 5, which the target still emits
        "reduced-vocab": lambda: model_drafter(draft, peaky_target, "draft", torch.tensor([1, 3, 4])),
        # a feature head (engine/draft_head.py) on the target decoder's own states, over 4 of the 6 tokens
        "feature-head": lambda: HeadDrafter(new_head(peaky_target, torch.tensor([0, 1, 3, 4])), decoder, "h", VOCAB),
        "ngram": NgramDrafter,
        "suffix": SuffixDrafter,
    }
    drafter = drafter[kind]()
    prompt = DE_BRUIJN
    counts, drafted = sampled_joint(peaky_target, drafter, prompt, decoder)
    assert drafted >= DRAWS  # every second token came out of a verified draft
    assert_same_distribution(counts, exact_joint(peaky_target, prompt))


def test_a_head_that_stops_at_its_floor_keeps_target_distribution(peaky_target):
    """Whether the head's draft stops (a token it gives less chance than the floor) depends on the token it drew;
    the output keeps the target's distribution all the same: a stopped position is the target's own draw."""
    decoder = make_decoder(peaky_target)
    torch.manual_seed(2)  # this head's top chance after the first token: 0.77 or 0.90, by the token
    drafter = HeadDrafter(new_head(peaky_target, torch.tensor([0, 1, 3, 4])), decoder, "h", VOCAB)
    counts, drafted = sampled_joint(peaky_target, drafter, DE_BRUIJN, decoder, adaptive="cost", draft_floor=0.85)
    assert DRAWS / 10 < drafted < DRAWS * 9 / 10  # both stopped and verified drafts, often
    assert_same_distribution(counts, exact_joint(peaky_target, DE_BRUIJN))


def test_verify_stochastic_matches_target_for_a_fixed_pair():
    """The rule alone: 10k draws with fixed p and q give p's distribution at position 0."""
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([[0.5, 0.3, 0.15, 0.05], [0.25, 0.25, 0.25, 0.25]])
    q = torch.tensor([[0.1, 0.2, 0.3, 0.4]])
    counts = np.zeros(4)
    for _ in range(DRAWS):
        proposal = [int(torch.multinomial(q[0], 1, generator=g))]
        accepted, token = verify_stochastic(p, proposal, q, g)
        counts[proposal[0] if accepted else token] += 1
    assert_same_distribution(counts, p[0].numpy())


def test_top_k_and_top_p_truncate_the_distribution():
    logits = torch.tensor([3.0, 2.0, 1.0, 0.0])
    assert (probabilities(logits, SamplingParams(temperature=1.0, top_k=2)) > 0).tolist() == [True, True, False, False]
    top_p = probabilities(logits, SamplingParams(temperature=1.0, top_p=0.7))
    assert (top_p > 0).tolist() == [True, True, False, False]
    assert float(top_p.sum()) == pytest.approx(1.0)
