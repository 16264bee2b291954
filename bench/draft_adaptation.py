"""Issue 56's figures: drafts trained by `specwatch draft train` on the bundled target's own answers, served by the
bundled engine (bf16, batch 1) beside plain, n-gram and suffix decoding, on prompts they never trained on.

Run (docs/engine.md's figures; about 17 minutes of capture, 15 of training, then the measure):
    .venv/bin/python -m bench.draft_adaptation --train-topics 139 --held-topics 4 --domain-tasks 40 \\
        --held-tasks 3 --answer-tokens 96 --steps 1200 --gamma 5 --lookahead cost --keep DIR
The drafts a `--keep DIR` run left, measured again (another gamma, lookahead or --draft-floor): add `--reuse`.
A tiny run that proves the path (about a minute):
    .venv/bin/python -m bench.draft_adaptation --train-topics 2 --held-topics 1 --domain-tasks 0 \\
        --answer-tokens 8 --steps 3

1. capture: the target's own greedy answers (float32, batched) to open-chat questions over the training
   topics, written as a `specwatch draft export` file (vLLM speculators' conversation JSONL); or `--data FILE`;
2. train `generic`: `specwatch draft train` on it (`--kind head` by default), timed, with its peak RSS;
3. domain (`--domain-tasks N` > 0): capture answers to coding questions over N tasks and retrain from `generic`
   on both captures (`draft train --init`): `adapted`;
4. measure: plain, `ngram`, `suffix` and each trained draft (`model:DIR`) in one engine, one thread, batch 1,
   a fixed draft length `--gamma` (or the engine's own, `--lookahead cost`), drafters rotated per prompt
   (suffix first: it learns each finished output, the others' answers to the same prompt included), on the
   held-out topics' and tasks' questions (never in a training file: checked). Prints acceptance (accepted /
   drafted tokens), tok/s (output tokens / end-to-end seconds, prefill included, the same for every row), the
   ratio to plain, and the goals.
"""

from __future__ import annotations

import argparse
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import orjson
import torch

from specwatch.engine.engine import Engine, EngineConfig, GenerateRequest
from specwatch.engine.loading import load_model
from specwatch.engine.lookahead import DEFAULT_DRAFT_FLOOR, check_draft_floor

TOPICS = (
    "sleep", "exercise", "cooking rice", "saving money", "learning a language", "gardening", "public speaking",
    "writing emails", "studying for exams", "drinking water", "time management", "reading more books",
    "making friends", "running a marathon", "baking bread", "keeping a journal", "travelling cheaply",
    "caring for a dog", "fixing a bike tyre", "staying focused", "meditation", "painting a room", "job interviews",
    "learning to swim", "growing tomatoes", "cleaning a kitchen", "planning a trip", "buying a laptop",
    "taking photos", "playing chess", "honey bees", "solar panels", "volcanoes", "coral reefs", "jazz music",
    "public libraries", "electric bicycles", "sourdough bread", "container shipping", "vaccines", "recycling",
    "birdwatching", "knitting", "camping", "composting", "learning guitar", "yoga", "home insurance",
    "climate change", "the stock market", "machine learning", "the internet", "photosynthesis", "the moon",
    "ancient Rome", "the French revolution", "black holes", "earthquakes", "rainforests", "the human heart",
    "dinosaurs", "chocolate", "coffee", "tea", "wine making", "cheese", "pizza", "sushi", "olive oil", "spices",
    "remote work", "team meetings", "customer service", "starting a business", "marketing", "negotiation",
    "leadership", "budgeting", "retirement planning", "credit cards", "renting an apartment", "buying a house",
    "moving to a new city", "wedding planning", "raising children", "teenagers", "elderly parents", "grief",
    "stress", "anxiety", "happiness", "gratitude", "motivation", "habits", "procrastination", "creativity",
    "writing a novel", "poetry", "film making", "podcasts", "social media", "online privacy", "passwords",
    "smartphones", "video games", "board games", "football", "basketball", "tennis", "cycling", "hiking",
    "fishing", "sailing", "skiing", "surfing", "rock climbing", "bird feeders", "houseplants", "cats", "horses",
    "butterflies", "oceans", "rivers", "deserts", "mountains", "glaciers", "weather forecasts", "hurricanes",
    "electric cars", "trains", "airplanes", "space travel", "Mars", "satellites", "robots", "3D printing",
    "batteries", "wind power", "nuclear energy", "water purification", "first aid", "nutrition", "vitamins",
)  # fmt: skip
QUESTIONS = (
    "Give me three tips about {}.",
    "Explain briefly why {} matters.",
    "What are common mistakes people make with {}?",
    "How do I get started with {}?",
    "Write a short paragraph about {}.",
    "What should a beginner know about {}?",
    "Describe the benefits and drawbacks of {}.",
    "Summarize the key facts about {}.",
)
TASKS = (
    "reverses a string", "checks whether a number is prime", "sums a list of numbers", "counts the vowels in a word",
    "returns the largest item of a list", "removes duplicates from a list", "computes a factorial",
    "returns the n-th Fibonacci number", "checks whether a word is a palindrome", "merges two sorted lists",
    "converts Celsius to Fahrenheit", "flattens a nested list", "counts words in a sentence",
    "finds the average of a list", "sorts a dictionary by its values", "reads a file and counts its lines",
    "checks whether a year is a leap year", "returns the square of each number in a list",
    "capitalizes every word of a sentence", "finds the second largest number in a list",
    "computes the greatest common divisor of two numbers", "joins a list of strings with commas",
    "checks whether two words are anagrams", "returns the even numbers of a list", "converts a list to a set",
    "counts how often each letter appears in a string", "finds the index of an item in a list",
    "multiplies two matrices", "generates a random password", "validates an email address",
    "returns the digits of a number", "converts a binary string to an integer", "rotates a list by k places",
    "checks whether a list is sorted", "removes the whitespace from a string", "computes the median of a list",
    "returns the common items of two lists", "splits a list into chunks of size n", "reverses the words of a sentence",
    "finds the longest word in a sentence", "computes compound interest", "converts a string to title case",
    "returns the minimum and maximum of a list", "checks whether a string contains only digits",
    "computes the power of a number without using **", "counts the lines of code in a Python file",
    "sums the digits of a number", "finds all prime numbers below n",
)  # fmt: skip
CODE = (
    "Write a Python function that {}.",
    "Show me how to write a Python function that {}, with an example.",
    "Fix this Python code so that it {}:\n```python\ndef f(x):\n    pass\n```",
)
TARGET = "SmolLM2-135M-Instruct"


def questions(forms: tuple[str, ...], subjects: tuple[str, ...]) -> list[str]:
    return [form.format(subject) for subject in subjects for form in forms]


@torch.inference_mode()
def capture(target, prompts: list[str], tokens: int, path: Path, batch: int = 32) -> None:
    """The target's own greedy answers (float32, left-padded batches), as `specwatch draft export` writes them."""
    tokenizer, rows, started = target.tokenizer, [], time.monotonic()
    tokenizer.padding_side = "left"
    for start in range(0, len(prompts), batch):
        chunk = prompts[start : start + batch]
        texts = [
            tokenizer.apply_chat_template([{"role": "user", "content": p}], tokenize=False, add_generation_prompt=True)
            for p in chunk
        ]
        encoded = tokenizer(texts, return_tensors="pt", padding=True)
        out = target.model.generate(
            **encoded, max_new_tokens=tokens, do_sample=False, pad_token_id=tokenizer.pad_token_id or 0
        )
        for prompt, answer in zip(chunk, out[:, encoded.input_ids.shape[1] :]):
            turns = [{"role": "user", "content": prompt}, {"role": "assistant", "content": tokenizer.decode(
                answer, skip_special_tokens=True)}]  # fmt: skip
            rows.append({"id": f"c{len(rows)}", "conversations": turns, "target_model": TARGET})
        print(f"  captured {len(rows)}/{len(prompts)} in {time.monotonic() - started:.0f} s", file=sys.stderr)
    path.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))


def trained_on(paths: list[Path]) -> set[str]:
    """The user turns of export files (the held-out prompts must not be among them)."""
    lines = [orjson.loads(line) for path in paths for line in path.read_bytes().splitlines() if line.strip()]
    return {turn["content"] for row in lines for turn in row["conversations"] if turn["role"] == "user"}


def train(args: argparse.Namespace, data: list[Path], out: Path, init: Path | None = None) -> tuple[float, float]:
    """`specwatch draft train` on `data` into `out`, in a process of its own: (wall seconds, its peak RSS MiB).
    Its own summary line is printed."""
    options = ["--kind", args.kind, "--steps", args.steps, "--draft-vocab", args.draft_vocab, "--gamma", args.gamma]
    options += ["--max-tokens", args.max_tokens, *(["--init", init] if init else [])]
    options += ["--layers", args.layers, "--train-layers", args.train_layers] if args.kind == "exit" else []
    command = [sys.executable, "-m", "specwatch", "draft", "train", "--data", *map(str, data), "--out", str(out)]
    started = time.monotonic()
    done = subprocess.run([*command, *map(str, options)], stdout=subprocess.PIPE, text=True)
    if done.returncode:
        sys.exit(f"draft train failed (exit {done.returncode})")
    print(done.stdout.strip())
    peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024  # KiB on Linux: the largest child's
    return time.monotonic() - started, peak


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

    @property
    def acceptance(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None


def measure(engine: Engine, prompts: list[str], drafters: dict[str, str | None], args) -> dict[str, Tally]:
    """Each prompt through every drafter in turn (load changes hit every row alike)."""
    tallies = {label: Tally() for label in drafters}
    for prompt in prompts:
        for label, spec in drafters.items():
            turns = [{"role": "user", "content": prompt}]
            request = GenerateRequest(messages=turns, max_tokens=args.answer_tokens, drafter=spec, gamma=args.gamma)
            tallies[label].add(engine.generate(request).record)
    return tallies


def report(title: str, tallies: dict[str, Tally]) -> None:
    plain = tallies["plain"].tok_s
    print(f"{title}\n{'drafter':10s} {'acceptance':>10s} {'tok/s':>7s} {'x plain':>8s} {'tokens':>7s}")
    for label, tally in tallies.items():
        acceptance = f"{tally.acceptance:.3f}" if tally.acceptance is not None else "-"
        ratio = tally.tok_s / plain if plain else 0.0
        print(f"{label:10s} {acceptance:>10s} {tally.tok_s:7.1f} {ratio:7.2f}x {tally.tokens:7d}")


def goals(chat: dict[str, Tally], code: dict[str, Tally] | None) -> None:
    """Issue 56's goals against what was measured: met or not, with the figures."""
    generic, plain = chat["trained"], chat["plain"].tok_s
    ratio = generic.tok_s / plain if plain else 0.0
    met = (generic.acceptance or 0) >= 0.6 and ratio >= 1.3
    print(f"goal open chat: acceptance {generic.acceptance or 0:.3f} (>= 0.6), {ratio:.2f}x plain (>= 1.3x): "
          f"{'met' if met else 'NOT met'}")  # fmt: skip
    if code is None:
        return
    rise = (code["adapted"].acceptance or 0) - (code["trained"].acceptance or 0)
    fall = (chat["trained"].acceptance or 0) - (chat["adapted"].acceptance or 0)
    met = rise >= 0.1 and fall <= 0.05
    print(f"goal domain: code acceptance {rise:+.3f} (>= +0.1), open chat {-fall:+.3f} (>= -0.05): "
          f"{'met' if met else 'NOT met'}")  # fmt: skip


def run(args: argparse.Namespace, work: Path) -> None:
    held_chat = questions(QUESTIONS, TOPICS[: args.held_topics])
    held_code = questions(CODE, TASKS[: args.held_tasks]) if args.domain_tasks else []
    if args.reuse:
        measure_all(args, work, held_chat, held_code)
        return
    chat_data, code_data = args.data or work / "train.jsonl", work / "code.jsonl"
    target = load_model("bundled", "float32") if args.data is None or args.domain_tasks else None
    if args.data is None:
        prompts = questions(QUESTIONS, TOPICS[args.held_topics : args.held_topics + args.train_topics])
        started = time.monotonic()
        capture(target, prompts, args.answer_tokens, chat_data)
        print(f"captured {len(prompts)} open-chat conversations in {time.monotonic() - started:.0f} s")
    if args.domain_tasks:
        prompts = questions(CODE, TASKS[args.held_tasks : args.held_tasks + args.domain_tasks])
        started = time.monotonic()
        capture(target, prompts, args.answer_tokens, code_data)
        print(f"captured {len(prompts)} coding conversations in {time.monotonic() - started:.0f} s")
    del target
    data = [chat_data, code_data] if args.domain_tasks else [chat_data]
    if overlap := trained_on(data) & set(held_chat + held_code):
        sys.exit(f"the training files hold {len(overlap)} of the held-out prompts, e.g. {sorted(overlap)[0]!r}")
    seconds, peak = train(args, [chat_data], work / "draft")
    print(f"trained in {seconds:.0f} s; peak RSS of the training process {peak:.0f} MiB")
    if args.domain_tasks:
        seconds, peak = train(args, data, work / "adapted", init=work / "draft")
        print(f"retrained on both captures from the generic draft in {seconds:.0f} s; peak RSS {peak:.0f} MiB")
    (work / "held.json").write_bytes(orjson.dumps(held_chat))  # bench/draft_gap.py's --prompts
    measure_all(args, work, held_chat, held_code)


def measure_all(args: argparse.Namespace, work: Path, held_chat: list[str], held_code: list[str]) -> None:
    """Every drafter, the trained ones in `work`, on the held-out prompts; the goals."""
    drafters = {"suffix": "suffix", "plain": None, "ngram": "ngram", "trained": f"model:{work / 'draft'}"}
    if held_code:
        drafters["adapted"] = f"model:{work / 'adapted'}"
    config = EngineConfig(
        dtype="bfloat16", threads=args.threads, lookahead=args.lookahead, draft_floor=args.draft_floor
    )
    engine = Engine(config)
    engine.generate(GenerateRequest(messages=[{"role": "user", "content": "Hi"}], max_tokens=4, drafter=None))
    print(f"held out: {len(held_chat)} open-chat prompts over {args.held_topics} topics, bf16, "
          f"{args.threads} thread(s), batch 1, gamma {args.gamma}, lookahead {args.lookahead}"
          + (f", draft floor {args.draft_floor}" if args.lookahead == "cost" else ""))  # fmt: skip
    chat = measure(engine, held_chat, drafters, args)
    report("open chat (held-out topics)", chat)
    code = None
    if args.domain_tasks:
        code = measure(engine, held_code, drafters, args)
        report(f"coding ({len(held_code)} prompts over {args.held_tasks} held-out tasks)", code)
    goals(chat, code)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, help="train on this open-chat export instead of capturing one")
    parser.add_argument(
        "--train-topics",
        type=int,
        default=120,
        help=f"topics captured for training ({len(QUESTIONS)} questions each; at most {len(TOPICS)} less held)",
    )
    parser.add_argument(
        "--held-topics", type=int, default=8, help=f"topics held out, measured on ({len(QUESTIONS)} questions each)"
    )
    parser.add_argument(
        "--domain-tasks", type=int, default=40, help="coding tasks captured (3 questions each; 0: none)"
    )
    parser.add_argument("--held-tasks", type=int, default=8, help="coding tasks held out, measured on")
    parser.add_argument("--answer-tokens", type=int, default=96, help="tokens of each captured and measured answer")
    parser.add_argument("--kind", choices=("head", "exit"), default="head", help="the draft `draft train` makes")
    parser.add_argument("--layers", type=int, default=6, help="exit only")
    parser.add_argument("--train-layers", type=int, default=2, help="exit only")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--draft-vocab", type=int, default=4096)
    parser.add_argument("--max-tokens", type=int, default=256, help="tokens kept of each training conversation")
    parser.add_argument("--gamma", type=int, default=3, help="draft length (the most, under --lookahead cost)")
    parser.add_argument(
        "--lookahead", choices=("fixed", "cost"), default="fixed", help="fixed: every round drafts gamma; cost: "
        "the engine's default, the draft length that maximises expected tokens/s (engine/lookahead.py)"
    )  # fmt: skip
    parser.add_argument(
        "--draft-floor", type=float, default=DEFAULT_DRAFT_FLOOR, help="with --lookahead cost: the engine's "
        f"--draft-floor (default {DEFAULT_DRAFT_FLOOR}; 0: the tokens/s optimum)",
    )  # fmt: skip
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--keep", type=Path, help="keep the captures, the drafts (draft/, adapted/) and held.json in this directory"
    )
    parser.add_argument("--reuse", action="store_true", help="measure the drafts an earlier --keep run left there")
    args = parser.parse_args(argv)
    try:
        check_draft_floor(args.draft_floor)
    except ValueError as exc:
        parser.error(f"--draft-floor: {exc}")
    if args.reuse and not (args.keep and (args.keep / "draft").is_dir()):
        parser.error("--reuse needs --keep DIR of an earlier run (its draft/ and, with --domain-tasks, adapted/)")
    if not 1 <= args.held_topics < len(TOPICS) or not 1 <= args.train_topics <= len(TOPICS) - args.held_topics:
        parser.error(f"need 1 <= --held-topics and --train-topics >= 1 with their sum <= {len(TOPICS)}")
    if args.domain_tasks and not (args.held_tasks >= 1 and args.held_tasks + args.domain_tasks <= len(TASKS)):
        parser.error(f"need 1 <= --held-tasks with --held-tasks + --domain-tasks <= {len(TASKS)}")
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
