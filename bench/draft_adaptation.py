"""Issue 56's figure: a draft trained on open chat by `specwatch draft train`, served by the bundled engine
(bf16, batch 1) beside plain, n-gram and suffix decoding, on prompts of topics it never trained on.

Run (the lead's full size; minutes of generation, then training, then the measure):
    .venv/bin/python -m bench.draft_adaptation --train-topics 36 --held-topics 8 --answer-tokens 96 \\
        --steps 400 --batch 4 --layers 6 --train-layers 2 --draft-vocab 4096
A tiny run that proves the path (about a minute):
    .venv/bin/python -m bench.draft_adaptation --train-topics 4 --held-topics 1 --answer-tokens 12 --steps 3

1. capture: the bundled target's own greedy bf16 answers to open-chat questions over the training topics,
   written as a `specwatch draft export` file (vLLM speculators' conversation JSONL); or `--data FILE`;
2. train: `specwatch draft train` on it (fp32), timed, with the process's peak RSS;
3. measure: plain, `ngram`, `suffix` and the trained draft (`model:DIR`) in one engine, one thread,
   batch 1, a fixed draft length `--gamma`, drafters rotated per prompt (suffix first: it learns each
   finished output, the others' answers to the same prompt included), on the held-out topics' questions
   (never in the training file: checked). Prints acceptance (accepted / drafted tokens), tok/s
   (output tokens / end-to-end seconds, prefill included, the same for every row) and the ratio to plain.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import orjson

from specwatch.cli import main as specwatch
from specwatch.engine.engine import Engine, EngineConfig, GenerateRequest

TOPICS = (
    "sleep", "exercise", "cooking rice", "saving money", "learning a language", "gardening", "public speaking",
    "writing emails", "studying for exams", "drinking water", "time management", "reading more books",
    "making friends", "running a marathon", "baking bread", "keeping a journal", "travelling cheaply",
    "caring for a dog", "fixing a bike tyre", "staying focused", "meditation", "painting a room", "job interviews",
    "learning to swim", "growing tomatoes", "cleaning a kitchen", "planning a trip", "buying a laptop",
    "taking photos", "playing chess", "honey bees", "solar panels", "volcanoes", "coral reefs", "jazz music",
    "public libraries", "electric bicycles", "sourdough bread", "container shipping", "vaccines", "recycling",
    "birdwatching", "knitting", "camping", "composting", "learning guitar", "yoga", "home insurance",
)  # fmt: skip
QUESTIONS = (
    "Give me three tips about {}.",
    "Explain briefly why {} matters.",
    "What are common mistakes people make with {}?",
    "How do I get started with {}?",
)
TARGET = "SmolLM2-135M-Instruct"


def questions(topics: tuple[str, ...]) -> list[str]:
    return [form.format(topic) for topic in topics for form in QUESTIONS]


def capture(engine: Engine, prompts: list[str], tokens: int, path: Path) -> None:
    """The target's own greedy answers, as `specwatch draft export` writes them."""
    rows = []
    for i, prompt in enumerate(prompts):
        turns = [{"role": "user", "content": prompt}]
        answer = engine.generate(GenerateRequest(messages=turns, max_tokens=tokens, drafter=None)).text
        rows.append({"id": f"c{i}", "conversations": [*turns, {"role": "assistant", "content": answer}]})
        rows[-1]["target_model"] = TARGET
    path.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))


def trained_on(path: Path) -> set[str]:
    """The user turns of an export file (the held-out prompts must not be among them)."""
    lines = [orjson.loads(line) for line in path.read_bytes().splitlines() if line.strip()]
    return {turn["content"] for row in lines for turn in row["conversations"] if turn["role"] == "user"}


def train(args: argparse.Namespace, data: Path, out: Path) -> float:
    """`specwatch draft train` on `data` into `out`; its wall time (its own summary line is printed)."""
    options = ["--layers", args.layers, "--train-layers", args.train_layers, "--steps", args.steps]
    options += ["--batch", args.batch, "--lr", args.lr, "--draft-vocab", args.draft_vocab, "--gamma", args.gamma]
    options += ["--max-tokens", args.max_tokens]
    started = time.monotonic()
    code = specwatch(["draft", "train", "--data", str(data), "--out", str(out), *map(str, options)])
    if code:
        sys.exit(f"draft train failed (exit {code})")
    return time.monotonic() - started


@dataclass
class Tally:
    accepted: int = 0
    drafted: int = 0
    tokens: int = 0
    seconds: float = 0.0

    def add(self, record) -> None:
        self.accepted += record.num_accepted_tokens
        self.drafted += record.num_draft_tokens
        self.tokens += record.output_tokens
        self.seconds += record.e2e_s

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds if self.seconds else 0.0


def measure(engine: Engine, prompts: list[str], drafters: dict[str, str | None], args) -> dict[str, Tally]:
    """Each prompt through every drafter in turn (load changes hit every row alike)."""
    tallies = {label: Tally() for label in drafters}
    for prompt in prompts:
        for label, spec in drafters.items():
            turns = [{"role": "user", "content": prompt}]
            request = GenerateRequest(messages=turns, max_tokens=args.answer_tokens, drafter=spec, gamma=args.gamma)
            tallies[label].add(engine.generate(request).record)
    return tallies


def report(tallies: dict[str, Tally]) -> None:
    plain = tallies["plain"].tok_s
    print(f"{'drafter':10s} {'acceptance':>10s} {'tok/s':>7s} {'x plain':>8s} {'tokens':>7s}")
    for label in ("plain", "ngram", "suffix", "trained"):
        tally = tallies[label]
        acceptance = f"{tally.accepted / tally.drafted:.3f}" if tally.drafted else "-"
        ratio = tally.tok_s / plain if plain else 0.0
        print(f"{label:10s} {acceptance:>10s} {tally.tok_s:7.1f} {ratio:7.2f}x {tally.tokens:7d}")


def run(args: argparse.Namespace, work: Path) -> None:
    engine = Engine(EngineConfig(dtype="bfloat16", threads=args.threads, lookahead="fixed"))
    held = questions(TOPICS[: args.held_topics])
    data = args.data or work / "train.jsonl"
    if args.data is None:
        started = time.monotonic()
        capture(
            engine, questions(TOPICS[args.held_topics : args.held_topics + args.train_topics]), args.answer_tokens, data
        )
        print(f"captured {len(trained_on(data))} training conversations in {time.monotonic() - started:.0f} s")
    if overlap := trained_on(data) & set(held):
        sys.exit(f"{data} holds {len(overlap)} of the held-out prompts, e.g. {sorted(overlap)[0]!r}")
    seconds = train(args, data, work / "draft")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux
    print(f"trained in {seconds:.0f} s; peak RSS of this process so far {peak:.0f} MiB")
    engine.generate(GenerateRequest(messages=[{"role": "user", "content": "Hi"}], max_tokens=4, drafter=None))
    # suffix first on each prompt: it learns every finished output, so after the others it would copy this answer
    drafters = {"suffix": "suffix", "plain": None, "ngram": "ngram", "trained": f"model:{work / 'draft'}"}
    (work / "held.json").write_bytes(orjson.dumps(held))  # bench/draft_gap.py's --prompts
    print(f"held out: {len(held)} prompts over {args.held_topics} topics, bf16, {args.threads} thread(s), batch 1")
    report(measure(engine, held, drafters, args))


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, help="train on this export instead of capturing one")
    parser.add_argument(
        "--train-topics",
        type=int,
        default=36,
        help=f"topics captured for training (4 questions each; at most {len(TOPICS)} less --held-topics)",
    )
    parser.add_argument("--held-topics", type=int, default=8, help="topics held out, measured on (4 questions each)")
    parser.add_argument("--answer-tokens", type=int, default=96, help="tokens of each captured and measured answer")
    parser.add_argument("--layers", type=int, default=6)
    parser.add_argument("--train-layers", type=int, default=2)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--lr", type=float, default=3e-4)
    parser.add_argument("--draft-vocab", type=int, default=4096)
    parser.add_argument("--max-tokens", type=int, default=256, help="tokens kept of each training conversation")
    parser.add_argument("--gamma", type=int, default=3, help="draft length, fixed, for every drafter")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--keep", type=Path, help="keep the capture (train.jsonl), the draft (draft/) and held.json in this directory"
    )
    args = parser.parse_args(argv)
    if not 1 <= args.held_topics < len(TOPICS) or not 1 <= args.train_topics <= len(TOPICS) - args.held_topics:
        parser.error(f"need 1 <= --held-topics and --train-topics >= 1 with their sum <= {len(TOPICS)}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    if args.keep:
        args.keep.mkdir(parents=True, exist_ok=True)
        run(args, args.keep)
        return
    with tempfile.TemporaryDirectory() as work:
        run(args, Path(work))


if __name__ == "__main__":
    main()
