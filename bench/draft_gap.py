"""Why a draft's held-out agreement and its served acceptance differ: each suspect measured on one draft.

Run: .venv/bin/python -m bench.draft_gap --draft DIR --data EXPORT.jsonl --prompts PROMPTS.json [--held 8]
(DIR from `specwatch draft train --kind exit`, EXPORT the file it trained on, its first --held conversations the ones
`draft train` kept out; PROMPTS a JSON list of user prompts it never trained on). Prints:
1. whether the trained layers are what loads (the exit's top layer differs from the target's, layer 0 not);
2. teacher-forced agreement on the held-out conversations over every position and over answers only, in
   fp32 and bf16 (transformers' forward), and through the engine's own decoder (bf16);
3. on PROMPTS served by the engine (bf16, one thread, gamma --gamma, greedy): the served acceptance, the
   agreement on the served answers, and the acceptance replayed from those matches (greedy rounds accept
   the leading run of agreeing positions): equal up to bf16 rounding when serving is right.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import orjson
import torch

from specwatch.engine.draft_head import is_head
from specwatch.engine.draft_training import Sample, conversation_tokens, matches, replayed_acceptance
from specwatch.engine.draft_vocab import load_vocabulary
from specwatch.engine.drafters import model_drafter
from specwatch.engine.engine import Engine, EngineConfig, GenerateRequest
from specwatch.engine.loading import load_model


def mean(rows: list[list[bool]]) -> float:
    total = sum(len(row) for row in rows)
    return sum(map(sum, rows)) / total if total else 0.0


def loaded_weights(target, draft) -> None:
    top = len(draft.model.layers) - 1
    same = [
        torch.equal(*pair) for pair in zip(draft.model.layers[top].parameters(), target.model.layers[top].parameters())
    ]
    first = [
        torch.equal(*pair) for pair in zip(draft.model.layers[0].parameters(), target.model.layers[0].parameters())
    ]
    print(f"layer {top} equals the target's: {all(same)}; layer 0 equals the target's: {all(first)}")


def teacher_forced(args, dtype: str, samples: list[Sample]) -> None:
    target, draft = load_model("bundled", dtype), load_model(str(args.draft), dtype)
    vocab = target.model.get_output_embeddings().weight.shape[0]
    rows = load_vocabulary(args.draft, vocab)
    if dtype == "float32":
        loaded_weights(target.model, draft.model)
    every = mean(matches(target.model, draft.model, [Sample(s.ids, 0) for s in samples], rows))
    answers = mean(matches(target.model, draft.model, samples, rows))
    print(f"{dtype}: agreement over every position {every:.3f}, over answers only {answers:.3f}")
    if dtype == "bfloat16":
        decoder = engine_decoder(target, draft, samples, rows)
        print(f"bfloat16, the engine's decoder: agreement over every position {decoder:.3f}")


@torch.no_grad()
def engine_decoder(target, draft, samples: list[Sample], rows) -> float:
    drafter = model_drafter(draft.model, target.model, "draft", rows)
    same = total = 0
    for sample in samples:
        drafter.begin(len(sample.ids) + 1)
        got = drafter.decoder.forward(torch.tensor(sample.ids)).argmax(-1)
        got = got if rows is None else rows[got]
        wanted = target.model(torch.tensor([sample.ids])).logits[0].argmax(-1)
        same, total = same + int((got == wanted).sum()), total + len(sample.ids)
    return same / total


def served(args) -> None:
    engine = Engine(EngineConfig(dtype="bfloat16", threads=1, lookahead="fixed"))
    spec = f"model:{args.draft}"
    drafter = engine.drafter(spec)
    accepted = drafted = 0
    rows: list[list[bool]] = []
    for prompt in orjson.loads(args.prompts.read_bytes()):
        turns = [{"role": "user", "content": prompt}]
        request = GenerateRequest(messages=turns, max_tokens=args.tokens, drafter=spec, gamma=args.gamma)
        result = engine.generate(request)
        accepted, drafted = accepted + result.record.num_accepted_tokens, drafted + result.record.num_draft_tokens
        rows.append(served_matches(engine, drafter, turns, result.token_ids))
    print(f"served: acceptance {accepted / max(drafted, 1):.3f} ({accepted}/{drafted})")
    replayed = replayed_acceptance(rows, args.gamma)
    print(f"served answers: agreement {mean(rows):.3f}, acceptance replayed at gamma {args.gamma} {replayed:.3f}")


@torch.no_grad()
def served_matches(engine: Engine, drafter, turns: list[dict], output: list[int]) -> list[bool]:
    """Per output token: whether the draft, fed the prompt and the output before it, predicts it."""
    prompt = engine.tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=True)
    prompt = list(prompt["input_ids"] if hasattr(prompt, "keys") else prompt)
    drafter.begin(len(prompt) + len(output) + 1)
    got = drafter.decoder.forward(torch.tensor(prompt + output)).argmax(-1)[len(prompt) - 1 : -1].tolist()
    got = got if drafter.to_target is None else [drafter.to_target[i] for i in got]
    return [a == b for a, b in zip(got, output)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--draft", type=Path, required=True)
    parser.add_argument("--data", type=Path, required=True)
    parser.add_argument("--prompts", type=Path, required=True)
    parser.add_argument("--held", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=160)
    parser.add_argument("--tokens", type=int, default=64, help="tokens of each served answer")
    parser.add_argument("--gamma", type=int, default=3)
    args = parser.parse_args()
    if is_head(args.draft):
        parser.error(f"{args.draft} is a feature head: this diagnoses a trained exit (`draft train --kind exit`)")
    torch.set_num_threads(1)
    tokenizer = load_model(str(args.draft), "float32").tokenizer
    held = conversation_tokens(args.data, tokenizer, args.max_tokens)[: args.held]
    for dtype in ("float32", "bfloat16"):
        teacher_forced(args, dtype, held)
    served(args)


if __name__ == "__main__":
    main()
