"""A reduced draft vocabulary (EAGLE-3's): the draft's head scores only the tokens the target most often
produces, so its cost is that of N rows, not the target's whole vocabulary.

Stored beside the draft's weights in `draft_vocab.safetensors` under EAGLE-3's names, as vLLM
`speculators` keeps them (`Eagle3Speculator` buffers):
- `d2t` int64 [N]: offsets, draft id d is target id d + d2t[d] (ids ascending);
- `t2d` bool [target vocab]: whether a target id is in the draft vocabulary.
The drafter proposes target ids; its proposal distribution is zero outside these N tokens, and
verification (engine/sampling.py) stays lossless whatever the proposal distribution.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

FILE = "draft_vocab.safetensors"


def frequent_tokens(targets: Iterable[int], size: int, vocab: int, always: Iterable[int] = ()) -> torch.Tensor:
    """Target ids, ascending: the `size` most frequent of `targets` (the tokens a draft must predict),
    plus `always` (special tokens: the end of a turn must stay proposable)."""
    if size < 1:
        raise ValueError(f"a draft vocabulary needs at least 1 token, got {size}")
    picked = {token for token, _ in Counter(targets).most_common(size)} | set(always)
    if not picked or not all(0 <= token < vocab for token in picked):
        raise ValueError(f"draft vocabulary ids must lie in [0, {vocab})")
    return torch.tensor(sorted(picked), dtype=torch.long)


def save_vocabulary(directory: Path, to_target: torch.Tensor, vocab: int) -> Path:
    """`d2t` and `t2d` of the draft vocabulary `to_target` (ascending target ids) into DIRECTORY/FILE."""
    to_target = to_target.to(torch.long).cpu()
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[to_target] = True
    path = Path(directory) / FILE
    save_file({"d2t": to_target - torch.arange(len(to_target)), "t2d": t2d}, str(path), metadata={"format": "pt"})
    return path


def load_vocabulary(directory: Path, vocab: int) -> torch.Tensor | None:
    """The draft vocabulary stored with a draft (target ids, ascending), None where the draft has none.
    ValueError for a map that does not fit a target of `vocab` tokens."""
    path = Path(directory) / FILE
    if not path.is_file():
        return None
    try:
        buffers = load_file(str(path))
    except (SafetensorError, OSError) as exc:
        raise ValueError(f"{path}: not a safetensors file ({exc})") from None
    d2t, t2d = buffers.get("d2t"), buffers.get("t2d")
    if d2t is None or t2d is None or d2t.dim() != 1 or t2d.shape != (vocab,) or t2d.dtype != torch.bool:
        raise ValueError(f"{path}: want d2t [N] and t2d bool [{vocab}] (the target's vocabulary)")
    to_target = torch.arange(len(d2t)) + d2t.to(torch.long)
    if not len(to_target) or bool((to_target < 0).any() or (to_target >= vocab).any()):
        raise ValueError(f"{path}: d2t is empty or points outside [0, {vocab})")
    if int(t2d.sum()) != len(to_target) or not bool(t2d[to_target].all()):
        raise ValueError(f"{path}: d2t and t2d name different tokens")
    return to_target
