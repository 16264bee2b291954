"""A tiny chat target with two domains, built in seconds, for the draft-adaptation loop (issue 56).

The bundled SmolLM2 takes ~25 minutes to train a draft for on this machine (docs/engine.md), so the loop's
test uses a target small enough to train in the test itself: a 4-layer Llama over a character tokenizer
with a chat template, trained briefly on chats of two domains whose text differs in kind:

- domain A, "prose": lowercase words from a small vocabulary;
- domain B, "codes": part numbers such as `C731-Y`.

The target learns both; a shallow exit distilled on domain A only (the "current" drafter) agrees with it
on A and much less on B, which it never saw. That is the honest scenario where a retrain on the traffic
that lost acceptance can win in seconds: measured with this module, exit agreement on the target's own
greedy answers was 0.87 on A and 0.13 on B for the A-trained exit, 0.93 on B for a B-trained one (an exit
trained on the target's answers); served by the engine (gamma 4), the current drafter's acceptance was 0.87
on A and 0.0 on B. Trained on A's corpus text rather than the target's answers, the exit depends on how far
the target was trained: 200 steps gave those figures, 300 steps left it at 0.48 on A.
"""

from __future__ import annotations

import random
import string
from pathlib import Path

import torch
import torch.nn.functional as F
from tokenizers import Tokenizer, decoders, models
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from specwatch.engine.draft_training import Sample, TrainConfig, _padded, save_draft, train_exit

SPECIAL = ["<unk>", "<|im_start|>", "<|im_end|>"]
TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
WORDS = [
    "the",
    "cat",
    "sat",
    "on",
    "a",
    "mat",
    "and",
    "ate",
    "some",
    "fish",
    "while",
    "rain",
    "fell",
    "over",
    "old",
    "town",
    "roofs",
]
DOMAINS = ("prose", "codes")
EXIT = TrainConfig(layers=1, train_layers=1, steps=60, batch=16, lr=1e-2)  # the drafts' shape and training


def tokenizer() -> PreTrainedTokenizerFast:
    """One token per printable character (a BPE with no merges), SmolLM2's chat markers, a chat template."""
    vocab = {token: i for i, token in enumerate([*SPECIAL, *string.printable[:95], "\n"])}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, bos_token=SPECIAL[1], eos_token=SPECIAL[2], unk_token=SPECIAL[0], pad_token=SPECIAL[2]
    )
    fast.chat_template = TEMPLATE
    return fast


def text(domain: str, rng: random.Random, words: int = 6) -> str:
    """A message of the domain."""
    if domain == "prose":
        return " ".join(rng.choice(WORDS) for _ in range(words))
    return " ".join(f"{rng.choice('ABCDEFGH')}{rng.randint(100, 999)}-{rng.choice('XYZ')}" for _ in range(words // 2))


def messages(domain: str, seed: int) -> list[dict]:
    """A user turn of the domain: the same seed, the same prompt."""
    return [{"role": "user", "content": text(domain, random.Random(f"{domain}:{seed}"))}]


def _chat_ids(tok, domain: str, rng: random.Random) -> list[int]:
    turns = [{"role": "user", "content": text(domain, rng)}, {"role": "assistant", "content": text(domain, rng, 8)}]
    ids = tok.apply_chat_template(turns, tokenize=True, add_generation_prompt=False)
    return list(ids["input_ids"] if hasattr(ids, "keys") else ids)


def train_target(tok, steps: int = 200, seed: int = 0) -> LlamaForCausalLM:
    """A 4-layer Llama (hidden 64) trained as a language model on chats of both domains."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=512, tie_word_embeddings=False,
        bos_token_id=1, eos_token_id=2, pad_token_id=2,
    )  # fmt: skip
    model, rng = LlamaForCausalLM(config), random.Random(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _ in range(steps):
        batch = [Sample(_chat_ids(tok, rng.choice(DOMAINS), rng)) for _ in range(16)]
        tokens, mask, _ = _padded(batch, torch.device("cpu"))
        logits = model(tokens, attention_mask=mask).logits[:, :-1].reshape(-1, config.vocab_size)
        loss = F.cross_entropy(logits, tokens[:, 1:].reshape(-1), reduction="none") * mask[:, 1:].reshape(-1)
        optimizer.zero_grad(set_to_none=True)
        (loss.sum() / mask[:, 1:].sum()).backward()
        optimizer.step()
    return model.eval()


def build(root: Path, target_steps: int = 200) -> tuple[Path, Path]:
    """(the target's directory `root/tiny-chat`, the current drafter's `root/current`: an exit trained on
    domain A's chats only). Served as `engine serve --model TARGET --drafters current=model:CURRENT`."""
    tok = tokenizer()
    target = train_target(tok, target_steps)
    target_dir = root / "tiny-chat"
    target.save_pretrained(target_dir)
    tok.save_pretrained(target_dir)
    rng = random.Random(1)
    draft, _ = train_exit(target, [Sample(_chat_ids(tok, "prose", rng)) for _ in range(200)], EXIT)
    return target_dir, save_draft(draft, tok, root / "current")
