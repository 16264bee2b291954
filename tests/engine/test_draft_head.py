"""Issue 56, the feature head in small (engine/draft_head.py): trained on a tiny Llama target's own states it
agrees with the target more on held-out sequences, saves and reloads to the same scores, drafts from the
state the engine's decoder keeps after each verification without changing one greedy output token (fp32),
and the acceptance it gets served is the one its held-out replay predicts."""

from __future__ import annotations

import functools
import json

import pytest
import torch
from transformers import LlamaForCausalLM

from specwatch.engine.decoder import LlamaDecoder
from specwatch.engine.draft_head import (
    HeadDrafter,
    HeadTraining,
    head_heldout,
    is_head,
    load_head,
    new_head,
    replayed_chains,
    save_head,
    target_states,
    train_head,
)
from specwatch.engine.draft_training import Sample, draft_vocabulary
from specwatch.engine.sampling import SamplingParams
from specwatch.engine.speculative import SpeculativeDecoder
from tests.engine.conftest import tiny_llama
from tests.engine.test_draft_training import one_thread, sequences  # noqa: F401 (a fixture)
from tests.engine.test_greedy_identity import hf_greedy

GREEDY = SamplingParams(temperature=0.0)


def greedy_loop(target, drafter, decoder, prompt, max_new: int, gamma: int, adaptive: str = "fixed", floor=0.0):
    loop = SpeculativeDecoder(decoder, drafter, adaptive=adaptive, draft_floor=floor)
    loop.prefill(prompt, max_new, gamma, GREEDY)
    while not loop.finished:
        loop.accept(loop.target.forward(loop.propose()), forward_s=0.0)
    return loop.tokens[len(prompt) :], loop.stats


def chain_target(steps: int = 60) -> LlamaForCausalLM:
    """A tiny Llama trained on the noisy chain (`sequences`): its next token depends on its context as a
    chat model's does on its answer so far, so its own states and tokens predict what it says next. A
    randomly initialised target's greedy output is noise no head can learn from."""
    target = tiny_llama(seed=3)
    data = torch.tensor([s.ids for s in sequences(512, seed=0, length=24)])
    optimizer = torch.optim.Adam(target.parameters(), lr=1e-2)
    generator = torch.Generator().manual_seed(0)
    for _ in range(steps):
        batch = data[torch.randint(0, len(data), (32,), generator=generator)]
        loss = target(batch, labels=batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return target.eval()


def greedy_answers(target, samples: list[Sample], tokens: int) -> list[Sample]:
    """The samples' prompts and the target's own greedy answers: what captured traffic holds."""
    prompts = torch.tensor([s.ids[: s.scored_from] for s in samples])
    with torch.no_grad():
        out = target.generate(
            prompts, attention_mask=torch.ones_like(prompts), max_new_tokens=tokens, min_new_tokens=tokens,
            do_sample=False, eos_token_id=None, pad_token_id=0,
        )  # fmt: skip
    return [Sample(row.tolist(), s.scored_from) for row, s in zip(out, samples)]


def test_a_trained_head_agrees_more_and_stays_lossless(tmp_path, one_thread):  # noqa: F811
    target = chain_target()
    weights = {name: value.clone() for name, value in target.state_dict().items()}
    train = greedy_answers(target, sequences(256, seed=1), 16)
    to_target = draft_vocabulary(train, 64, 256, always=[255])
    config = HeadTraining(steps=150, batch=64, depth=2, lr=1e-2)
    held = greedy_answers(target, sequences(16, seed=2), 16)
    head, report = train_head(target, train, to_target, config, held_out=held)
    assert report.last_loss < 0.2 * report.first_loss
    assert report.after.agreement > report.before.agreement + 0.5, report  # measured 0.000 -> 0.914
    assert report.after.acceptance > report.before.acceptance, report
    assert all(torch.equal(value, weights[name]) for name, value in target.state_dict().items())  # target untouched

    out = save_head(head, tmp_path / "head", vocab=256, target_name="tiny")
    assert is_head(out) and json.loads((out / "config.json").read_text())["draft_vocab_size"] == len(to_target)
    saved = load_head(out, target)
    probe_states, probe_embeds = torch.randn(3, 64), torch.randn(3, 64)
    with torch.no_grad():
        again = saved.logits(saved(probe_states, probe_embeds))
        assert torch.equal(again, head.logits(head(probe_states, probe_embeds)))
    assert torch.equal(saved.to_target, to_target)

    prompt = sequences(1, seed=4)[0].ids[:4]
    decoder = LlamaDecoder(target)
    drafter = HeadDrafter(saved, decoder, "model:head", 256)
    tokens, stats = greedy_loop(target, drafter, decoder, prompt, 24, 3)
    assert tokens == hf_greedy(target, prompt, 24) and stats.num_draft_tokens > 0
    # served as replayed: the same rounds, from the states the engine's decoder kept (fp32: the same argmaxes)
    served = Sample(prompt + tokens, len(prompt))
    embed = target.get_input_embeddings().weight.detach()
    replay = head_heldout(saved, embed, target.lm_head.weight.detach(), [served], target_states(target, [served]), 3)
    assert stats.num_accepted_tokens / stats.num_draft_tokens == pytest.approx(replay.acceptance), replay
    assert stats.num_accepted_tokens > 0


def asking(propose, asked: list[int], tokens, k, *rest):
    asked.append(k)
    return propose(tokens, k, *rest)


def test_a_head_sizes_its_drafts_by_its_own_confidence():
    """Under the 'cost' lookahead the engine verifies only the prefix of a head's draft worth it by the head's
    own probabilities (an untrained head's are low: most of its drafts are cut), losslessly."""
    target = tiny_llama(seed=3)
    prompt = sequences(1, seed=4)[0].ids[:4]
    want = hf_greedy(target, prompt, 24)
    drafted = {}
    for adaptive in ("fixed", "cost"):
        torch.manual_seed(0)
        decoder = LlamaDecoder(target)
        drafter = HeadDrafter(new_head(target, torch.arange(256)), decoder, f"model:head-{adaptive}", 256)
        asked = []
        drafter.propose = functools.partial(asking, drafter.propose, asked)
        tokens, stats = greedy_loop(target, drafter, decoder, prompt, 24, 4, adaptive)
        assert tokens == want
        drafted[adaptive] = stats.num_draft_tokens
        # asked for a whole draft every round (the last ones capped by max_new): what is verified is cut after
        assert len(asked) == stats.lookahead_rounds and set(asked[:-3]) == {4}, (asked, stats)
        prefixes = drafter.confidence  # the last draft's: each prefix's product of the head's probabilities
        assert 1 <= len(prefixes) <= 4 and all(0 < b <= a <= 1 for a, b in zip([1.0, *prefixes], prefixes)), prefixes
    assert drafted["cost"] < drafted["fixed"] / 2, drafted


def test_a_head_stops_drafting_at_a_token_below_the_floor():
    """With a draft floor the head drafts on only while its likeliest token's chance reaches it (the tokens after
    one it doubts are not drafted at all); the output stays the target's."""
    target = tiny_llama(seed=3)
    prompt = sequences(1, seed=4)[0].ids[:4]
    want = hf_greedy(target, prompt, 24)
    torch.manual_seed(0)
    head = new_head(target, torch.arange(256))
    head.lm_head.mul_(40.0)  # sharp enough that some of its chances pass a floor of 0.5 and some do not
    chances, drafted = [], {}
    for floor in (0.0, 0.5):
        decoder = LlamaDecoder(target)
        drafter = HeadDrafter(head, decoder, f"model:head-{floor}", 256)
        drafter.propose = functools.partial(kept_confidence, drafter, drafter.propose, chances)
        tokens, stats = greedy_loop(target, drafter, decoder, prompt, 24, 4, "cost", floor)
        assert tokens == want
        drafted[floor] = stats.num_draft_tokens
    passed = [b / a for draft in chances for a, b in zip([1.0, *draft], draft)]
    assert min(passed) < 0.5 < max(passed), passed  # the unfloored run saw chances on both sides
    assert 0 < drafted[0.5] < drafted[0.0], drafted


def kept_confidence(drafter, propose, into, tokens, k, *rest):
    """`propose`, with each draft's prefix confidences kept in `into` (the floored drafter's are checked)."""
    out = propose(tokens, k, *rest)
    if drafter.stop_below:
        assert all(b / a >= drafter.stop_below for a, b in zip([1.0, *drafter.confidence], drafter.confidence))
    into.append(list(drafter.confidence))
    return out


def test_replayed_rounds_leave_the_last_token_to_the_target():
    # starts 0..4 (5 answer tokens after the first): round at 0 drafts 3 of which 2 lead ([T,T,F]), the
    # target's token makes 3 committed; at 3 one token is left to draft before the last (the target's)
    hits = torch.tensor([[1, 1, 0], [0, 0, 0], [0, 0, 0], [1, 1, 1], [1, 1, 1], [1, 1, 1]], dtype=torch.bool)
    assert replayed_chains([hits], 3) == pytest.approx(3 / 4)


def test_a_head_that_does_not_fit_the_target_is_refused(tmp_path):
    target = tiny_llama(seed=3)
    head = new_head(target, torch.tensor([1, 2, 3]))
    out = save_head(head, tmp_path / "head", vocab=256)
    with pytest.raises(ValueError, match="hidden size 64, the target's is 32"):
        load_head(out, tiny_llama(seed=3, hidden=32))
    (out / "model.safetensors").write_bytes(b"junk")
    with pytest.raises(ValueError, match="not a readable feature head"):
        load_head(out, target)
    assert not is_head(tmp_path) and not is_head(tmp_path / "missing")


def test_a_head_drafts_nothing_without_the_targets_state_for_its_position():
    target = tiny_llama(seed=3)
    decoder = LlamaDecoder(target)
    drafter = HeadDrafter(new_head(target, torch.arange(256)), decoder, "model:head", 256)
    decoder.reset(32)
    assert drafter.propose([1, 2, 3], 3, GREEDY, None) == ([], None)  # no forward yet
    decoder.forward(torch.tensor([1, 2, 3]))
    assert drafter.propose([1, 2, 3], 3, GREEDY, None) == ([], None)  # the cache already holds the last token
    assert len(drafter.propose([1, 2, 3, 4], 3, GREEDY, None)[0]) == 3


def test_a_head_saved_over_another_replaces_it_whole(tmp_path):
    target = tiny_llama(seed=3)
    out = save_head(new_head(target, torch.tensor([1, 2, 3])), tmp_path / "head", vocab=256)
    (out / "stale.txt").write_text("from the earlier head")
    save_head(new_head(target, torch.tensor([4, 5])), out, vocab=256)
    assert load_head(out, target).to_target.tolist() == [4, 5]
    assert not (out / "stale.txt").exists() and sorted(p.name for p in tmp_path.iterdir()) == ["head"]
