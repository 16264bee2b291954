"""Drafters propose the next few tokens cheaply; the target model then verifies them.

One small interface, four kinds (names as they appear in telemetry):
- `ngram`: prompt lookup — copy what followed the latest earlier occurrence of the
  last n tokens (n = 3 falling back to 2). Free to run; wins on input-grounded text.
- `suffix`: suffix decoding (engine/suffix.py) — the most frequent continuation of the context's longest
  suffix seen earlier in this request or in recent requests' outputs. Free to run; learns across requests.
- `model:<name>`: a small causal LM sharing the target's tokenizer, with its own KV cache.
- `early-exit:<k>`: the target's first k layers + final norm + head, sharing its weights.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Protocol

import torch
from transformers import PreTrainedModel

from specwatch.engine.decoder import Decoder, LlamaDecoder, make_decoder
from specwatch.engine.sampling import SamplingParams, greedy, probabilities, sample


class Drafter(Protocol):
    """A draft source. One that sizes its drafts from its own estimates (suffix decoding) also sets
    `sizes_drafts = True` and, after each `propose`, `confidence`: for each draft prefix, its estimate
    that the prefix is accepted whole; the 'cost' lookahead then trims the draft (LookaheadModel.trim). One that
    drafts token by token also has `stop_below`: it stops drafting at a token it gives less chance than that."""

    name: str

    def begin(self, max_len: int) -> None:
        """Start a new request whose sequence holds at most `max_len` tokens."""

    def propose(
        self, tokens: list[int], k: int, params: SamplingParams, generator: torch.Generator | None
    ) -> tuple[list[int], torch.Tensor | None]:
        """Up to k tokens to follow `tokens`, and their proposal probabilities [len, vocab] (None: one-hot)."""

    def rollback(self, committed: int) -> None:
        """After verification: only the first `committed` positions the drafter has seen are still valid."""


@dataclass(frozen=True)
class NgramConfig:
    max_n: int = 3
    min_n: int = 2

    def __post_init__(self) -> None:
        if not 1 <= self.min_n <= self.max_n <= 16:
            raise ValueError(f"need 1 <= min_n <= max_n <= 16, got min_n={self.min_n} max_n={self.max_n}")


class NgramDrafter:
    """Prompt lookup over prompt + generated tokens, indexed incrementally (O(new tokens) per step)."""

    name = "ngram"

    def __init__(self, config: NgramConfig = NgramConfig()) -> None:
        self.config = config
        self.begin(0)

    def begin(self, max_len: int) -> None:
        # n -> {n-gram: index of the token that followed its latest occurrence}
        self._next_after: dict[int, dict[tuple[int, ...], int]] = {
            n: {} for n in range(self.config.min_n, self.config.max_n + 1)
        }
        self._indexed = 0  # tokens[:_indexed] have had every n-gram ending there registered

    def propose(self, tokens, k, params, generator):
        self._index(tokens)
        for n in range(self.config.max_n, self.config.min_n - 1, -1):
            start = self._next_after[n].get(tuple(tokens[-n:])) if len(tokens) >= n else None
            if start is not None:
                return tokens[start : start + k], None
        return [], None  # draft only when a match exists

    def _index(self, tokens: list[int]) -> None:
        # register each n-gram ending before the last token: its continuation tokens[end] exists
        for end in range(max(self._indexed, 1), len(tokens)):
            for n, table in self._next_after.items():
                if end >= n:
                    table[tuple(tokens[end - n : end])] = end
        self._indexed = max(self._indexed, len(tokens))

    def rollback(self, committed: int) -> None:
        pass  # the index only ever holds committed tokens: nothing to undo


class ModelDrafter:
    """Drafts autoregressively with a decoder of its own (a small model, or the target's first k layers).
    `to_target` (a reduced draft vocabulary, engine/draft_vocab.py): the decoder scores only these
    target ids; the drafter proposes target ids, its proposal distribution [len, `vocab`] zero elsewhere."""

    sizes_drafts = False  # a feature head sets it (engine/draft_head.py): its `confidence` sizes its drafts
    stop_below = 0.0  # `sizes_drafts`: stop at a token of less chance (its decoder sets LookaheadModel.floor)

    def __init__(self, decoder: Decoder, name: str, to_target: torch.Tensor | None = None, vocab: int = 0) -> None:
        self.decoder = decoder
        self.confidence: list[float] = []  # `sizes_drafts`: the last draft's prefixes' products of probabilities
        self.name = name
        self.device = getattr(decoder, "device", torch.device("cpu"))
        self.to_target = None if to_target is None else to_target.tolist()  # draft id -> target id
        self._columns = None if to_target is None else to_target.to(self.device)
        self.vocab = vocab

    def begin(self, max_len: int) -> None:
        self.decoder.reset(max_len)

    def propose(self, tokens, k, params, generator):
        draft: list[int] = []
        step_probs: list[torch.Tensor] = []
        self.confidence = []
        logits = self._first_logits(tokens)
        if logits is None:
            return [], None
        while True:
            probs = None if params.greedy else probabilities(logits, params)
            if self.sizes_drafts:
                # the likeliest token's chance, known before a token is drawn: sizing a sampled draft by its
                # drawn tokens' own chances would bias what verification keeps (the target's distribution)
                chance = float((probs if probs is not None else torch.softmax(logits.float(), -1)).max())
                if chance < self.stop_below:  # `trim` would cut here: drafting on is wasted
                    break
                self.confidence.append(chance * (self.confidence[-1] if self.confidence else 1.0))
            if probs is None:
                token = int(greedy(logits))
            else:
                step_probs.append(probs)
                token = sample(probs, generator)
            token = token if self.to_target is None else self.to_target[token]
            draft.append(token)
            if len(draft) == k:
                break
            logits = self._next_logits(token)
        return draft, (self._widened(torch.stack(step_probs)) if step_probs else None)

    def _first_logits(self, tokens: list[int]) -> torch.Tensor | None:
        """Scores of the token after `tokens` (None: no draft this round)."""
        pending = tokens[self.decoder.length :]  # what the draft cache has not seen yet
        return self.decoder.forward(torch.tensor(pending, device=self.device), keep=1)[-1]

    def _next_logits(self, token: int) -> torch.Tensor:
        """Scores of the token after `token` (a target id), just drafted."""
        return self.decoder.forward(torch.tensor([token], device=self.device))[-1]

    def _widened(self, probs: torch.Tensor) -> torch.Tensor:
        """Proposal probabilities over the target's vocabulary: a reduced vocabulary's, zero elsewhere."""
        if self.to_target is None:
            return probs
        return probs.new_zeros((probs.shape[0], self.vocab)).index_copy_(1, self._columns, probs)

    def rollback(self, committed: int) -> None:
        self.decoder.crop(committed)


def model_drafter(
    draft_model: PreTrainedModel, target_model: PreTrainedModel, name: str, to_target: torch.Tensor | None = None
) -> ModelDrafter:
    """A separate draft model; its vocabulary must be the target's, token for token. `to_target`: its
    head scores only these target ids (a reduced draft vocabulary, engine/draft_vocab.py)."""
    draft_vocab = draft_model.get_output_embeddings().weight.shape[0]
    target_vocab = target_model.get_output_embeddings().weight.shape[0]
    if draft_vocab != target_vocab:
        raise ValueError(
            f"draft model {name!r} has a vocabulary of {draft_vocab} tokens, the target has {target_vocab}: "
            "a draft must share the target's tokenizer"
        )
    decoder = make_decoder(draft_model, head_rows=to_target)
    return ModelDrafter(decoder, f"model:{name}", to_target, target_vocab)


def early_exit_drafter(target_model: PreTrainedModel, layers: int) -> ModelDrafter:
    if not LlamaDecoder.supports(target_model):
        raise ValueError(f"early exit needs a Llama-architecture target, not {target_model.config.model_type!r}")
    return ModelDrafter(LlamaDecoder(target_model, num_layers=layers), f"early-exit:{layers}")


def truncated_copy(model: PreTrainedModel, layers: int) -> PreTrainedModel:
    """A standalone model made of `model`'s first `layers` layers, sharing its weights.

    Used as a separate draft model (`model:` drafter, or transformers' assistant_model)
    that is exactly the early-exit drafter, so the two paths can be compared.
    """
    config = copy.deepcopy(model.config)
    config.num_hidden_layers = layers
    with torch.device("meta"):
        small = type(model)(config)
    small.model.embed_tokens, small.model.layers = model.model.embed_tokens, model.model.layers[:layers]
    small.model.norm, small.lm_head = model.model.norm, model.lm_head
    small.model.rotary_emb = model.model.rotary_emb
    return small.eval()
