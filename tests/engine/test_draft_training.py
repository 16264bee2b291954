"""Issue 56, the training path in small: a shallow exit of a tiny Llama target, trained against the target's
distribution over a reduced draft vocabulary, agrees with it more on held-out sequences, saves as a
transformers directory (speculators' config, the d2t/t2d map) that reloads to the same logits, and drafts
for greedy speculative decoding without changing one output token (fp32)."""

from __future__ import annotations

import json

import pytest
import torch
from transformers import AutoModelForCausalLM

from specwatch.engine.draft_training import (
    Sample,
    TrainConfig,
    conversation_tokens,
    draft_vocabulary,
    exit_model,
    heldout,
    matches,
    replayed_acceptance,
    save_draft,
    train_exit,
)
from specwatch.engine.draft_vocab import load_vocabulary
from specwatch.engine.drafters import model_drafter
from tests.engine.conftest import tiny_llama
from tests.engine.test_greedy_identity import hf_greedy, run_loop


def sequences(count: int, seed: int, length: int = 16, states: int = 32) -> list[Sample]:
    """Traffic with structure a draft can learn (a noisy chain over 32 tokens), as a domain's captures have;
    held-out sequences come from other seeds. Uniformly random tokens have none: nothing generalises."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        ids = [int(torch.randint(0, states, (1,), generator=g))]
        for _ in range(length - 1):
            ids.append((5 * ids[-1] + 3 + int(torch.randint(0, 3, (1,), generator=g))) % states)
        out.append(Sample(ids, 4))  # the first 4 tokens: the "prompt"
    return out


def target_answers(target, samples: list[Sample]) -> list[Sample]:
    """The samples' prompts with the target's own greedy next tokens as answers: what captured traffic holds
    (the synthetic chain is not this random target's output, so its tokens would make a useless vocabulary)."""
    with torch.no_grad():
        return [
            Sample(
                s.ids[: s.scored_from]
                + target(torch.tensor([s.ids])).logits[0, s.scored_from - 1 : -1].argmax(-1).tolist(),
                s.scored_from,
            )
            for s in samples
        ]


@pytest.fixture
def one_thread():
    """One torch thread: steady on a shared 2-core machine (DESIGN.md), and the test stays ~1 s."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_a_trained_exit_agrees_more_and_stays_lossless(tmp_path, one_thread):
    target = tiny_llama(seed=3, init=0.5)  # a larger init: a 4-layer target whose deep layers matter
    config = TrainConfig(layers=2, train_layers=1, steps=40, batch=16, lr=1e-2)
    weights = {name: value.clone() for name, value in target.state_dict().items()}
    train = sequences(512, seed=1)
    to_target = draft_vocabulary(target_answers(target, train[:64]), 64, 256, always=[255])  # and one "special"
    assert len(to_target) == 65 and 255 in to_target.tolist()
    draft, report = train_exit(target, train, config, held_out=sequences(16, seed=2), to_target=to_target)
    assert report.last_loss < 0.6 * report.first_loss
    assert report.after.agreement > report.before.agreement + 0.05, report  # measured 0.149 -> 0.245
    assert report.after.acceptance > report.before.acceptance, report
    assert all(torch.equal(value, weights[name]) for name, value in target.state_dict().items())  # target untouched
    out = save_draft(draft, None, tmp_path / "draft", to_target, target_name="tiny", gamma=4)
    saved = AutoModelForCausalLM.from_pretrained(out).eval()
    probe = torch.tensor([sequences(1, seed=9)[0].ids])
    with torch.no_grad():
        assert torch.allclose(saved(probe).logits, draft(probe).logits, atol=1e-5)
    assert torch.equal(load_vocabulary(out, 256), to_target)
    # vLLM loads every *.safetensors of a directory without an index: the index names the weights file only
    index = json.loads((out / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) == {"model.safetensors"} and "lm_head.weight" in index["weight_map"]
    config_json = json.loads((out / "config.json").read_text())
    assert config_json["speculators_model_type"] == "independent" and config_json["draft_vocab_size"] == 65
    assert config_json["speculators_config"]["proposal_methods"][0]["speculative_tokens"] == 4
    prompt = sequences(1, seed=4)[0].ids[:12]
    drafter = model_drafter(saved, target, "trained", load_vocabulary(out, 256))
    assert drafter.decoder.vocab_size == 65  # the head scores the reduced vocabulary only
    tokens, stats = run_loop(target, drafter, prompt, 24, 4)
    assert tokens == hf_greedy(target, prompt, 24) and stats.num_draft_tokens > 0
    assert stats.num_accepted_tokens > 0


def test_held_out_figures_score_the_answer_only():
    """A draft is only asked to continue answers: the held-out agreement counts the answer's positions,
    not the prompt's (counting a memorisable system prompt made 0.42 on answers read as 0.61)."""
    target = tiny_llama(seed=3, init=0.5)
    draft = exit_model(target, TrainConfig(layers=2, train_layers=1))
    whole = [Sample(s.ids, 0) for s in sequences(4, seed=5)]
    answers = [Sample(s.ids, 9) for s in whole]
    per_position = matches(target, draft, whole)
    assert [len(row) for row in matches(target, draft, answers)] == [len(s.ids) - 8 for s in whole]
    assert matches(target, draft, answers) == [row[8:] for row in per_position]
    expected = sum(sum(row[8:]) for row in per_position) / sum(len(row[8:]) for row in per_position)
    assert heldout(target, draft, answers, gamma=3).agreement == pytest.approx(expected)


def test_replayed_acceptance_follows_greedy_rounds():
    # first token from the prompt's forward; rounds of 3 from position 1: [T,T,F] 2 of 3, bonus at 3;
    # from 4: [T,T,T] 3 of 3, bonus at 7; from 8: [F] 0 of 1 (the end)
    assert replayed_acceptance([[False, True, True, False, True, True, True, False, False]], 3) == 5 / 7
    assert replayed_acceptance([[True]], 3) == 0.0


def test_an_export_file_is_read_as_chat_template_tokens(tmp_path):
    class Template:  # the one tokenizer method this reads: a chat template over role/content turns
        def apply_chat_template(self, turns, tokenize, add_generation_prompt):
            ids = [x for t in turns for x in ([9] if t["role"] == "assistant" else []) + [len(t["content"])]]
            return ids + ([9] if add_generation_prompt else [])  # 9: the assistant header

    path = tmp_path / "export.jsonl"
    line = b'{"id": "a", "conversations": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hey"}]}'
    path.write_bytes(line + b"\n\n")
    assert conversation_tokens(path, Template()) == [Sample([2, 9, 3], 2)]  # scored: the answer's tokens
    with pytest.raises(ValueError, match="no conversation to train on"):  # cut before its answer: nothing to score
        conversation_tokens(path, Template(), max_tokens=2)
    path.write_bytes(b'{"messages": []}\n')
    with pytest.raises(ValueError, match="not a conversation line"):
        conversation_tokens(path, Template())
