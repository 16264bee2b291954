"""A draft head on the target's own features (EAGLE's idea; issue 56): the bundled engine's trained draft.

The target's last hidden state at position t (after its final norm: what its head reads) already holds
everything the target knows about what follows; the head adds the token the target chose there and predicts
the hidden state at t + 1, which the target's own head rows (a reduced draft vocabulary) turn into the next
draft token. Chained: the predicted state and the drafted token give the one after.

    state_{t+1} ~ norm(blocks(fc([state_t, embed(token_{t+1})])))      logits = lm_head_rows(state_{t+1})

Why this shape and not EAGLE's decoder layer: the head has no attention, so it keeps no cache of its own;
after each verification it needs one row of the target's features (the last accepted position's), which
the engine's forwards keep anyway (`LlamaDecoder.features`). A drafted token costs `fc`, the blocks and the
reduced head: a few million multiply-adds against the target's 135 M. Verification is the engine's, so
serving it is lossless whatever the head predicts. It is not one of vLLM speculators' formats (EAGLE and
EAGLE-3 need that attention layer and the target's mid-layer features; MLP speculators have their own
embeddings and full-vocabulary heads per step): it is saved in its own config and safetensors, with the
draft vocabulary in EAGLE-3's `d2t`/`t2d` (engine/draft_vocab.py).

Training (`train_head`): the target's features over captured conversations, computed once; the head learns,
over the answers' positions, the target's next-token distribution (KL over the draft vocabulary) and its next
state (smooth L1), unrolled `depth` steps on its own predicted states, as it runs when it drafts.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file
from transformers import PreTrainedModel

from specwatch.engine.draft_training import Heldout, Sample, TrainReport
from specwatch.engine.draft_vocab import FILE, load_vocabulary, save_vocabulary
from specwatch.engine.drafters import ModelDrafter

MODEL_TYPE = "specwatch-feature-head"
WEIGHTS = "model.safetensors"


@dataclass(frozen=True)
class HeadConfig:
    hidden: int
    intermediate: int
    blocks: int = 1
    eps: float = 1e-5


@dataclass(frozen=True)
class HeadTraining:
    steps: int = 600
    batch: int = 256  # positions a step
    depth: int = 3  # steps unrolled on the head's own predicted states
    lr: float = 1e-3
    state_weight: float = 0.1  # the smooth L1 on predicted states, beside the KL on their distributions
    seed: int = 0
    gamma: int = 3  # the draft length the held-out acceptance is replayed at

    def __post_init__(self) -> None:
        if min(self.steps, self.batch, self.depth, self.gamma) < 1 or not 0 < self.lr < 1:
            raise ValueError("steps, batch, depth and gamma must be positive and lr in (0, 1)")


class _Block(torch.nn.Module):
    """x + SwiGLU(norm(x)): a Llama layer's MLP half."""

    def __init__(self, hidden: int, intermediate: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.norm = torch.nn.Parameter(torch.ones(hidden))
        self.gate_up = torch.nn.Linear(hidden, 2 * intermediate, bias=False)
        self.down = torch.nn.Linear(intermediate, hidden, bias=False)
        torch.nn.init.zeros_(self.down.weight)  # starts as the identity

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(F.rms_norm(x, x.shape[-1:], self.norm, self.eps)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class FeatureHead(torch.nn.Module):
    """The head; `lm_head` [N, hidden] are the target's head rows of the draft vocabulary `to_target` [N]."""

    def __init__(self, config: HeadConfig, lm_head: torch.Tensor, to_target: torch.Tensor) -> None:
        super().__init__()
        self.config = config
        self.fc = torch.nn.Linear(2 * config.hidden, config.hidden, bias=False)
        blocks = (_Block(config.hidden, config.intermediate, config.eps) for _ in range(config.blocks))
        self.blocks = torch.nn.ModuleList(blocks)
        self.norm = torch.nn.Parameter(torch.ones(config.hidden))
        self.register_buffer("lm_head", lm_head.detach().clone())
        # saved as the draft vocabulary's d2t/t2d (engine/draft_vocab.py), not with the weights
        self.register_buffer("to_target", to_target.to(torch.long), persistent=False)

    def forward(self, states: torch.Tensor, embeds: torch.Tensor) -> torch.Tensor:
        """The next positions' states [n, hidden] from these positions' states and the next tokens' embeddings."""
        x = self.fc(torch.cat([states, embeds], dim=-1))
        for block in self.blocks:
            x = block(x)
        return F.rms_norm(x, x.shape[-1:], self.norm, self.config.eps)

    def logits(self, states: torch.Tensor) -> torch.Tensor:
        """Scores [n, N] over the draft vocabulary."""
        return F.linear(states, self.lm_head)


def new_head(target: PreTrainedModel, to_target: torch.Tensor, blocks: int = 1) -> FeatureHead:
    """An untrained head for `target` (torch's default initialisation: one that starts by passing the state
    through is stuck predicting the token it was given, measured: held-out agreement 0.10 against 0.34)."""
    cfg = target.config
    config = HeadConfig(cfg.hidden_size, cfg.intermediate_size, blocks, cfg.rms_norm_eps)
    lm_head = target.get_output_embeddings().weight.detach().float()[to_target]
    return FeatureHead(config, lm_head, to_target)


@torch.no_grad()
def target_states(target: PreTrainedModel, samples: list[Sample], batch: int = 8) -> list[torch.Tensor]:
    """Per sample, the target's final-norm hidden states [len, hidden] (float32)."""
    out = []
    for start in range(0, len(samples), batch):
        chunk = samples[start : start + batch]
        width = max(len(s.ids) for s in chunk)
        tokens = torch.zeros((len(chunk), width), dtype=torch.long)
        mask = torch.zeros_like(tokens)
        for row, sample in enumerate(chunk):
            tokens[row, : len(sample.ids)], mask[row, : len(sample.ids)] = torch.tensor(sample.ids), 1
        hidden = target.model(tokens.to(target.device), attention_mask=mask.to(target.device)).last_hidden_state
        out += [hidden[row, : len(s.ids)].float().cpu() for row, s in enumerate(chunk)]
    return out


class _Corpus:
    """Samples flattened: ids [T], states [T, hidden], and the starts t (a state at t, the token at t + 1)
    from which `depth` steps stay inside one answer."""

    def __init__(self, samples: list[Sample], states: list[torch.Tensor], depth: int) -> None:
        self.ids = torch.tensor([t for s in samples for t in s.ids])
        self.states = torch.cat(states)
        starts, offset = [], 0
        for sample in samples:
            first = offset + max(sample.scored_from - 1, 0)  # the prompt's last position: the first draft's state
            starts += range(first, offset + len(sample.ids) - 1 - depth)
            offset += len(sample.ids)
        self.starts = torch.tensor(starts, dtype=torch.long)


def _unrolled_loss(
    head: FeatureHead, embed: torch.Tensor, corpus: _Corpus, starts: torch.Tensor, depth: int, weight: float
):
    """The mean over `depth` chained steps of KL(target || head) over the draft vocabulary, plus `weight`
    times the smooth L1 of the predicted state."""
    states = corpus.states[starts]
    loss = states.new_zeros(())
    for j in range(depth):
        states = head(states, embed[corpus.ids[starts + 1 + j]])
        wanted = corpus.states[starts + 1 + j]
        teacher = F.log_softmax(head.logits(wanted), dim=-1)
        student = F.log_softmax(head.logits(states), dim=-1)
        kl = F.kl_div(student, teacher, log_target=True, reduction="batchmean")
        loss = loss + kl + weight * F.smooth_l1_loss(states, wanted)
    return loss / depth


def train_head(
    target: PreTrainedModel,
    samples: list[Sample],
    to_target: torch.Tensor,
    config: HeadTraining = HeadTraining(),
    held_out: list[Sample] = (),
    on_step: Callable[[int, float], None] | None = None,
    blocks: int = 1,
    init: FeatureHead | None = None,
):
    """A head trained on `samples` (their answers' positions) against `target`, from `init`'s weights where
    given (a retrain: its blocks, its vocabulary's rows re-read from the target); measured on `held_out`.
    Returns (head, TrainReport)."""
    started = time.monotonic()
    torch.manual_seed(config.seed)
    head = new_head(target, to_target, init.config.blocks if init is not None else blocks)
    if init is not None:
        head.load_state_dict({k: v for k, v in init.state_dict().items() if k != "lm_head"}, strict=False)
    embed = target.get_input_embeddings().weight.detach().float()
    corpus = _Corpus(samples, target_states(target, samples), config.depth)
    if not len(corpus.starts):
        raise ValueError(f"no answer is longer than {config.depth + 2} tokens: nothing to train the head on")
    held = (held_out, target_states(target, held_out)) if held_out else None
    head_weight = target.get_output_embeddings().weight.detach().float()
    before = head_heldout(head, embed, head_weight, *held, config.gamma) if held else None
    optimizer = torch.optim.AdamW([p for p in head.parameters() if p.requires_grad], lr=config.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, config.lr, total_steps=config.steps, pct_start=0.05)
    generator = torch.Generator().manual_seed(config.seed)
    losses = []
    for _ in range(config.steps):
        starts = corpus.starts[torch.randint(0, len(corpus.starts), (config.batch,), generator=generator)]
        loss = _unrolled_loss(head, embed, corpus, starts, config.depth, config.state_weight)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        losses.append(loss.item())
        if on_step is not None:
            on_step(len(losses), losses[-1])
    head.eval()
    after = head_heldout(head, embed, head_weight, *held, config.gamma) if held else None
    return head, TrainReport(config.steps, losses[0], losses[-1], before, after, time.monotonic() - started)


@torch.no_grad()
def head_matches(head: FeatureHead, embed, head_weight, samples: list[Sample], states: list[torch.Tensor], gamma: int):
    """Per sample, [starts, gamma] booleans: row s is a round that starts from the target's state at s and
    the token at s + 1 (from the prompt's last position on); column j whether its (j + 1)-th draft token is
    the target's greedy token after s + 1 + j. Chains run on the true tokens (a round stops at its first
    miss anyway)."""
    out = []
    for sample, state in zip(samples, states):
        ids = torch.tensor(sample.ids)
        wanted = F.linear(state, head_weight).argmax(-1)  # wanted[t]: the target's greedy token after t
        first = max(sample.scored_from - 1, 0)
        starts = torch.arange(first, len(ids) - 1)
        hits = torch.zeros((len(starts), gamma), dtype=torch.bool)
        states_now = state[starts]
        for j in range(gamma):
            index = (starts + 1 + j).clamp(max=len(ids) - 1)  # past the end: scored, never replayed
            states_now = head(states_now, embed[ids[index]])
            hits[:, j] = head.to_target[head.logits(states_now).argmax(-1)] == wanted[index]
        out.append(hits)
    return out


def head_heldout(head, embed, head_weight, samples, states, gamma: int) -> Heldout:
    """Agreement (the first draft token's) and greedy acceptance replayed in rounds of `gamma`."""
    chains = head_matches(head, embed, head_weight, samples, states, gamma)
    first = torch.cat([c[:, 0] for c in chains]) if chains else torch.zeros(0, dtype=torch.bool)
    return Heldout(first.float().mean().item() if len(first) else 0.0, replayed_chains(chains, gamma))


def replayed_chains(chains: list[torch.Tensor], gamma: int) -> float:
    """Greedy acceptance of `gamma`-token rounds: a round from start s accepts its chain's leading hits,
    then the target's token; the next round starts after it."""
    accepted = drafted = 0
    for hits in chains:
        at = 0
        while True:  # as the engine runs: a draft leaves the request's last token to the target
            k = min(gamma, len(hits) - 2 - at)
            if k <= 0:
                break
            row = hits[at, :k].tolist()
            run = next((i for i in range(k) if not row[i]), k)
            accepted, drafted, at = accepted + run, drafted + k, at + run + 1
    return accepted / drafted if drafted else 0.0


def save_head(head: FeatureHead, out: Path, vocab: int, target_name: str | None = None) -> Path:
    """The head as a directory: `config.json` (its kind, sizes and verifier), `model.safetensors`, and the
    draft vocabulary's `d2t`/`t2d`; the engine serves it as `model:OUT`. Written beside and then moved in
    whole: an interrupted save leaves the earlier head at OUT, never one file of each."""
    out = Path(out)
    staged = out.with_name(f".{out.name}.part")
    shutil.rmtree(staged, ignore_errors=True)
    staged.mkdir(parents=True)
    config = {"model_type": MODEL_TYPE, "architectures": ["FeatureHead"], **asdict(head.config)}
    config |= {"draft_vocab_size": len(head.to_target), "verifier": target_name}
    weights = {name: tensor.detach().contiguous() for name, tensor in head.state_dict().items()}
    save_file(weights, str(staged / WEIGHTS), metadata={"format": "pt"})
    save_vocabulary(staged, head.to_target, vocab)
    (staged / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    if out.exists():
        shutil.rmtree(out)
    staged.rename(out)
    return out


def is_head(directory: Path) -> bool:
    """Whether `directory` holds a feature head (`save_head`), not a transformers model."""
    try:
        return json.loads((Path(directory) / "config.json").read_text()).get("model_type") == MODEL_TYPE
    except (OSError, ValueError, AttributeError):
        return False


def load_head(directory: Path, target: PreTrainedModel) -> FeatureHead:
    """The head saved in `directory`, for `target`; ValueError naming what does not fit."""
    directory = Path(directory)
    cfg = target.config
    vocab = target.get_output_embeddings().weight.shape[0]
    try:
        raw = json.loads((directory / "config.json").read_text())
        config = HeadConfig(int(raw["hidden"]), int(raw["intermediate"]), int(raw["blocks"]), float(raw["eps"]))
        weights = load_file(str(directory / WEIGHTS))
    except (OSError, ValueError, KeyError, TypeError, SafetensorError) as exc:
        raise ValueError(f"{directory}: not a readable feature head ({exc})") from None
    if config.hidden != cfg.hidden_size:
        raise ValueError(f"{directory}: a head for hidden size {config.hidden}, the target's is {cfg.hidden_size}")
    to_target = load_vocabulary(directory, vocab)
    if to_target is None:
        raise ValueError(f"{directory}: no {FILE} (a feature head scores a draft vocabulary)")
    head = FeatureHead(config, torch.zeros((len(to_target), config.hidden)), to_target)
    try:
        head.load_state_dict(weights, strict=True)
    except RuntimeError as exc:
        raise ValueError(f"{directory}: weights do not fit the config ({str(exc)[:300]})") from None
    for parameter in head.parameters():
        parameter.requires_grad_(False)
    return head.eval()


class HeadDrafter(ModelDrafter):
    """Drafts with a feature head from the state the target's last forward left at the last committed token's
    position (`LlamaDecoder.features`, read after each verification): no cache of its own.

    It sizes its own drafts (`sizes_drafts`): under the 'cost' lookahead it drafts the cap and the engine keeps
    the prefix worth verifying, read from `confidence` (each prefix's product of the head's own probabilities of
    its tokens, calibrated against what verification accepts: LookaheadModel.trim), as EAGLE-2 sizes its draft
    trees by the draft's confidence. A draft position costs the head a few million multiply-adds, so drafting
    the cap and trimming costs little; the fewer doubtful tokens verified, the higher the acceptance."""

    sizes_drafts = True

    def __init__(self, head: FeatureHead, target, name: str, vocab: int) -> None:
        super().__init__(target, name, head.to_target, vocab)
        self.head = head
        self._state: torch.Tensor | None = None

    def begin(self, max_len: int) -> None:
        self._state = None  # the target's decoder is the engine's to reset

    def rollback(self, committed: int) -> None:
        pass

    @torch.inference_mode()
    def _first_logits(self, tokens: list[int]) -> torch.Tensor | None:
        target = self.decoder
        row = target.length - 1 - target.features_from  # the state before tokens[-1]: its cache's last position
        if target.features is None or target.length != len(tokens) - 1 or not 0 <= row < len(target.features):
            return None
        self._state = target.features[row : row + 1].float()
        return self._next_logits(tokens[-1])

    @torch.inference_mode()
    def _next_logits(self, token: int) -> torch.Tensor:
        self._state = self.head(self._state, self.decoder.embed[token : token + 1].float())
        return self.head.logits(self._state)[0]
