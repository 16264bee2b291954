"""A trained shallow exit (issue 56): the target's first k layers, their last `train_layers` and the final
norm fine-tuned to predict the full target's next-token distribution on captured conversations.

Why this architecture: the engine verifies any drafter losslessly, and a shallow exit is a plain Llama
model of the target's own shapes and vocabulary, so it serves as an ordinary `model:PATH` drafter
(`engine serve --drafters NAME=model:DIR`) with the engine's fast decoder, no new kernel and no new
verification path. Untrained, the first k <= 10 layers of SmolLM2 agree with the full model 1-4% of the
time (DESIGN.md); training only the exit's top layers against the target's own distribution on the slice
that lost acceptance is what this module does. The embeddings and lm_head stay the target's (frozen), so
the saved draft is the target's layers 0..k-1 with the retrained ones in place.

    sequences = conversation_tokens(export_path, tokenizer, max_tokens=256)
    draft, report = train_exit(target_model, sequences[:-8], TrainConfig(layers=6), held_out=sequences[-8:])
    save_draft(draft, tokenizer, out_dir)

Distillation: loss = KL(target || draft) over every position of each sequence (the target's soft labels
teach the ranking, not just the argmax greedy acceptance checks).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import orjson
import torch
import torch.nn.functional as F
from transformers import PreTrainedModel

from specwatch.engine.drafters import truncated_copy


@dataclass(frozen=True)
class TrainConfig:
    layers: int = 6  # the exit: the target's first `layers` layers
    train_layers: int = 2  # of those, the top ones trained (with the final norm); the rest stay the target's
    steps: int = 200
    batch: int = 4
    lr: float = 3e-4
    seed: int = 0

    def __post_init__(self) -> None:
        if not 1 <= self.train_layers <= self.layers:
            raise ValueError(f"train_layers must be in [1, layers={self.layers}], not {self.train_layers}")
        if self.steps < 1 or self.batch < 1 or not 0 < self.lr < 1:
            raise ValueError("steps and batch must be positive and lr in (0, 1)")


@dataclass(frozen=True)
class TrainReport:
    steps: int
    first_loss: float
    last_loss: float
    agreement_before: float | None  # held-out share of positions where the draft's argmax is the target's
    agreement_after: float | None
    seconds: float


def conversation_tokens(path: Path, tokenizer, max_tokens: int = 256) -> list[list[int]]:
    """Each line of a `specwatch draft export` file (speculators' `conversations`) rendered with the
    target's chat template and tokenized, cut to `max_tokens`. ValueError for a file with no conversation."""
    sequences = []
    for number, line in enumerate(Path(path).read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        try:
            turns = orjson.loads(line)["conversations"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            raise ValueError(f"{path}:{number}: not a conversation line (want {{'conversations': [...]}})") from None
        ids = tokenizer.apply_chat_template(turns, tokenize=True, add_generation_prompt=False)
        ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
        if len(ids) >= 2:
            sequences.append(list(ids)[:max_tokens])
    if not sequences:
        raise ValueError(f"{path}: no conversation to train on")
    return sequences


def exit_model(target: PreTrainedModel, config: TrainConfig) -> PreTrainedModel:
    """The target's first `layers` layers as a model of their own: the top `train_layers` and the final norm
    copied (trainable), the rest, the embeddings and the head shared with the target and frozen."""
    draft = truncated_copy(target, config.layers)
    keep = config.layers - config.train_layers
    trained = [copy.deepcopy(layer) for layer in draft.model.layers[keep:]]
    draft.model.layers = torch.nn.ModuleList([*draft.model.layers[:keep], *trained])
    draft.model.norm = copy.deepcopy(draft.model.norm)
    for parameter in draft.parameters():
        parameter.requires_grad_(False)
    for parameter in [*draft.model.norm.parameters(), *(p for layer in trained for p in layer.parameters())]:
        parameter.requires_grad_(True)
    return draft


def train_exit(
    target: PreTrainedModel,
    sequences: list[list[int]],
    config: TrainConfig,
    held_out: list[list[int]] = (),
    on_step: Callable[[int, float], None] | None = None,
) -> tuple[PreTrainedModel, TrainReport]:
    """Train an exit on `sequences` (token ids) against `target`; agreement measured on `held_out`.
    `on_step(step, loss)` after each step (progress)."""
    started = time.monotonic()
    generator = torch.Generator().manual_seed(config.seed)
    draft = exit_model(target, config)
    before = agreement(target, draft, held_out) if held_out else None
    trainable = [p for p in draft.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=config.lr, weight_decay=0.0)
    losses = []
    for _ in range(config.steps):
        picked = torch.randint(0, len(sequences), (config.batch,), generator=generator).tolist()
        loss = _distill_loss(target, draft, [sequences[i] for i in picked])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if on_step is not None:
            on_step(len(losses), losses[-1])
    draft.eval()
    after = agreement(target, draft, held_out) if held_out else None
    report = TrainReport(config.steps, losses[0], losses[-1], before, after, time.monotonic() - started)
    return draft, report


def _padded(batch: list[list[int]], device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded token ids and their mask (1: a real token)."""
    width = max(len(ids) for ids in batch)
    tokens = torch.zeros((len(batch), width), dtype=torch.long, device=device)
    mask = torch.zeros((len(batch), width), dtype=torch.long, device=device)
    for row, ids in enumerate(batch):
        tokens[row, : len(ids)], mask[row, : len(ids)] = torch.tensor(ids, device=device), 1
    return tokens, mask


def _distill_loss(target: PreTrainedModel, draft: PreTrainedModel, batch: list[list[int]]) -> torch.Tensor:
    """Mean over real positions of KL(target || draft) of the next-token distributions."""
    tokens, mask = _padded(batch, target.device)
    with torch.no_grad():
        teacher = F.log_softmax(target(tokens, attention_mask=mask).logits.float(), dim=-1)  # log p_target
    student = F.log_softmax(draft(tokens, attention_mask=mask).logits.float(), dim=-1)
    per_position = F.kl_div(student, teacher, log_target=True, reduction="none").sum(-1)
    return (per_position * mask).sum() / mask.sum()


@torch.no_grad()
def agreement(target: PreTrainedModel, draft: PreTrainedModel, sequences: list[list[int]], batch: int = 8) -> float:
    """The share of positions where the draft's next token (argmax) is the target's: greedy acceptance of
    a one-token draft given the right prefix."""
    same = total = 0
    for start in range(0, len(sequences), batch):
        tokens, mask = _padded(sequences[start : start + batch], target.device)
        wanted = target(tokens, attention_mask=mask).logits.argmax(-1)
        got = draft(tokens, attention_mask=mask).logits.argmax(-1)
        same, total = same + int(((wanted == got) & mask.bool()).sum()), total + int(mask.sum())
    return same / total if total else 0.0


def save_draft(draft: PreTrainedModel, tokenizer, out: Path) -> Path:
    """The draft as a transformers directory (config, safetensors, tokenizer): `model:OUT` for the engine."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    standalone = copy.deepcopy(draft)  # unshared tensors: save_pretrained refuses aliases of another model
    for parameter in standalone.parameters():
        parameter.requires_grad_(False)
    standalone.config.num_hidden_layers = len(standalone.model.layers)
    standalone.save_pretrained(out)
    if tokenizer is not None:  # the engine loads a draft directory with its tokenizer
        tokenizer.save_pretrained(out)
    return out
