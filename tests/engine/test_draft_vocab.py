"""A reduced draft vocabulary's map (engine/draft_vocab.py): EAGLE-3's d2t offsets and t2d mask, as vLLM
speculators stores them (src/speculators/models/eagle3 at 11ecdd3385ed00258b89b0de8b55a0074ced9ec4:
`d2t` int64 [draft vocab], target id = draft id + d2t; `t2d` bool [target vocab]), written and read back;
a map that does not fit the target is refused with a message, before any request."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import load_file, save_file

from specwatch.engine.draft_vocab import FILE, frequent_tokens, load_vocabulary, save_vocabulary
from specwatch.engine.drafters import model_drafter
from specwatch.engine.sampling import SamplingParams
from tests.engine.conftest import tiny_llama


def test_the_most_frequent_tokens_and_the_specials_in_eagle3_offsets(tmp_path):
    ids = frequent_tokens([7, 7, 7, 3, 3, 9, 1], size=2, vocab=16, always=[2])
    assert ids.tolist() == [2, 3, 7]
    save_vocabulary(tmp_path, ids, 16)
    stored = load_file(str(tmp_path / FILE))
    assert stored["d2t"].tolist() == [2, 2, 5] and stored["t2d"].nonzero().flatten().tolist() == [2, 3, 7]
    assert torch.equal(load_vocabulary(tmp_path, 16), ids)
    assert load_vocabulary(tmp_path / "elsewhere", 16) is None  # no map: the whole vocabulary


@pytest.mark.parametrize(
    "buffers, message",
    [
        ({"d2t": torch.tensor([0, 0])}, "want d2t"),
        ({"d2t": torch.tensor([0, 0]), "t2d": torch.ones(8, dtype=torch.bool)}, "want d2t"),  # not the target's size
        ({"d2t": torch.tensor([0, 20]), "t2d": torch.zeros(16, dtype=torch.bool)}, "outside"),
        ({"d2t": torch.tensor([0, 0]), "t2d": torch.zeros(16, dtype=torch.bool)}, "different tokens"),
    ],
)
def test_a_map_that_does_not_fit_the_target_is_refused(tmp_path, buffers, message):
    save_file(buffers, str(tmp_path / FILE))
    with pytest.raises(ValueError, match=message):
        load_vocabulary(tmp_path, 16)
    (tmp_path / FILE).write_bytes(b"not safetensors")
    with pytest.raises(ValueError, match="not a safetensors file"):
        load_vocabulary(tmp_path, 16)


def test_a_reduced_drafter_proposes_target_ids_from_its_vocabulary_only():
    target, draft = tiny_llama(seed=1, vocab=32, layers=2), tiny_llama(seed=2, vocab=32, layers=1)
    keep = torch.tensor([3, 5, 8, 13, 21])
    drafter = model_drafter(draft, target, "small", keep)
    drafter.begin(64)
    tokens, probs = drafter.propose([1, 2, 3], 4, SamplingParams(temperature=1.0), torch.Generator().manual_seed(0))
    assert set(tokens) <= set(keep.tolist()) and probs.shape == (4, 32)
    assert torch.allclose(probs.sum(-1), torch.ones(4)) and probs[:, [0, 1, 2, 4]].sum() == 0
    drafter.begin(64)
    greedy, _ = drafter.propose([1, 2, 3], 4, SamplingParams(temperature=0.0), None)
    assert set(greedy) <= set(keep.tolist())


def test_slots_share_one_reduced_head_and_never_batch_with_a_whole_one():
    """Drafters of several slots over one draft share its reduced head (one copy, one batched forward); a
    decoder scoring another set of rows must not join that forward (its first decoder's head scores all)."""
    target, draft = tiny_llama(seed=1, vocab=32, layers=2), tiny_llama(seed=2, vocab=32, layers=1)
    keep = torch.tensor([3, 5, 8])
    one, two = (model_drafter(draft, target, "small", keep).decoder for _ in range(2))
    whole = model_drafter(draft, target, "small").decoder
    assert one.head is two.head and one.shares_weights(two)
    assert not one.shares_weights(whole) and not whole.shares_weights(one)
