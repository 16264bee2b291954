"""Issue 56, the training path in small: a shallow exit of a tiny Llama target, trained against the target's
distribution, agrees with it more on held-out sequences, saves as a transformers directory that reloads to
the same logits, and drafts for greedy speculative decoding without changing one output token (fp32)."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM

from specwatch.engine.draft_training import TrainConfig, conversation_tokens, save_draft, train_exit
from specwatch.engine.drafters import model_drafter
from tests.engine.conftest import tiny_llama
from tests.engine.test_greedy_identity import hf_greedy, run_loop


def sequences(count: int, seed: int, length: int = 16, states: int = 32) -> list[list[int]]:
    """Traffic with structure a draft can learn (a noisy chain over 32 tokens), as a domain's captures have;
    held-out sequences come from other seeds. Uniformly random tokens have none: nothing generalises."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(count):
        ids = [int(torch.randint(0, states, (1,), generator=g))]
        for _ in range(length - 1):
            ids.append((5 * ids[-1] + 3 + int(torch.randint(0, 3, (1,), generator=g))) % states)
        out.append(ids)
    return out


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
    draft, report = train_exit(target, sequences(512, seed=1), config, held_out=sequences(16, seed=2))
    assert report.last_loss < 0.6 * report.first_loss
    assert report.agreement_after > report.agreement_before + 0.1, report  # measured 0.184 -> 0.363
    assert all(torch.equal(value, weights[name]) for name, value in target.state_dict().items())  # target untouched
    saved = AutoModelForCausalLM.from_pretrained(save_draft(draft, None, tmp_path / "draft")).eval()
    probe = torch.tensor(sequences(1, seed=9))
    with torch.no_grad():
        assert torch.allclose(saved(probe).logits, draft(probe).logits, atol=1e-5)
    prompt = sequences(1, seed=4)[0][:12]
    tokens, stats = run_loop(target, model_drafter(saved, target, "trained"), prompt, 24, 4)
    assert tokens == hf_greedy(target, prompt, 24) and stats.num_draft_tokens > 0


def test_an_export_file_is_read_as_chat_template_tokens(tmp_path):
    class Template:  # the one tokenizer method this reads: a chat template over role/content turns
        def apply_chat_template(self, turns, tokenize, add_generation_prompt):
            return [len(t["content"]) for t in turns]

    path = tmp_path / "export.jsonl"
    line = b'{"id": "a", "conversations": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hey"}]}'
    path.write_bytes(line + b"\n\n")
    assert conversation_tokens(path, Template()) == [[2, 3]]
    path.write_bytes(b'{"messages": []}\n')
    with pytest.raises(ValueError, match="not a conversation line"):
        conversation_tokens(path, Template())
