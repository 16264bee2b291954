"""`specwatch draft export`: a slice of the collector's captures as a training set for a draft model.

specwatch draft export --collector URL --out FILE.jsonl --target-model NAME
    [--tenant T] [--scenario S] [--drafter D] [--model M] [--below-acceptance A] [--prompt-tokens LO-HI]
    [--token TOKEN (default: SPECWATCH_ADMIN_TOKEN)]

Writes vLLM `speculators`' conversation JSONL, one chat capture a line (`telemetry.capture.speculators_row`:
`conversations` of role/content turns, the captured output as the last assistant turn, the target model
named in each line), for `python scripts/prepare_data.py --model NAME --data FILE.jsonl --output DIR`.
Completion captures (raw text, no turns) are left out and counted. Reading captures needs the admin role.
"""

from __future__ import annotations

import argparse
import itertools
import os
import sys
from pathlib import Path

import httpx
import orjson

from specwatch.common.auth import first_token
from specwatch.common.errors import UsageError
from specwatch.draft_canary import register_draft_canary
from specwatch.telemetry.capture import speculators_row


def register(subparsers: argparse._SubParsersAction) -> None:
    draft = subparsers.add_parser("draft", help="draft adaptation: export captures, train a draft, canary it")
    commands = draft.add_subparsers(dest="draft_command", required=True, metavar="SUBCOMMAND")
    export = commands.add_parser("export", help="write a slice of the captures as speculators' conversation JSONL")
    export.add_argument("--collector", required=True, help="the collector's URL")
    export.add_argument("--out", type=Path, required=True, help="the JSONL file to write (replaced whole)")
    export.add_argument("--target-model", required=True, help="the target model the draft is trained for")
    add_slice_arguments(export)
    export.add_argument(
        "--token",
        default=first_token(os.environ.get("SPECWATCH_ADMIN_TOKEN")),
        help="an admin token of the collector (default: SPECWATCH_ADMIN_TOKEN)",
    )
    export.set_defaults(handler=run_export)
    _register_train(commands)
    register_draft_canary(commands)  # specwatch/draft_canary.py


def _register_train(commands: argparse._SubParsersAction) -> None:
    train = commands.add_parser("train", help="train a draft for the bundled engine's target on exports (CPU, minutes)")
    train.add_argument(
        "--data", type=Path, nargs="+", required=True, help="`specwatch draft export` files (read together)"
    )
    train.add_argument("--out", type=Path, required=True, help="the draft's directory")
    train.add_argument("--model", default="bundled", help="the target: 'bundled' (SmolLM2), a .gguf or an HF directory")
    train.add_argument(
        "--kind",
        choices=KINDS,
        default="head",
        help="head: a feature head on the target's own states (engine/draft_head.py); exit: a trained shallow "
        "exit, the target's first layers (default: %(default)s)",
    )
    train.add_argument("--init", type=Path, help="head: start from this head (a retrain on a new slice)")
    train.add_argument("--depth", type=int, default=3, help="head: steps unrolled on its own states (default: 3)")
    train.add_argument("--layers", type=int, default=6, help="exit: the target's first N layers (default: 6)")
    train.add_argument("--train-layers", type=int, default=2, help="exit: of those, the top N trained (default: 2)")
    train.add_argument("--steps", type=int, help="optimiser steps (default: head 600, exit 200)")
    train.add_argument("--batch", type=int, help="answer positions (head, default 256) or conversations (exit, 4)")
    train.add_argument("--lr", type=float, help="learning rate (default: head 3e-3, exit 3e-4)")
    train.add_argument("--max-tokens", type=int, default=256, help="tokens kept of each conversation")
    train.add_argument("--held-out", type=int, default=8, help="conversations kept out to measure agreement")
    train.add_argument(
        "--draft-vocab",
        type=int,
        default=4096,
        help="the draft's head scores only the N most frequent answer tokens of the data, plus the special "
        "tokens (EAGLE-3's reduced vocabulary; 0: the target's whole vocabulary, exit only; default: %(default)s)",
    )
    train.add_argument("--gamma", type=int, default=3, help="draft length the held-out acceptance is replayed at")
    train.set_defaults(handler=run_train)


KINDS = ("head", "exit")
DEFAULTS = {"head": {"steps": 600, "batch": 256, "lr": 3e-3}, "exit": {"steps": 200, "batch": 4, "lr": 3e-4}}


def add_slice_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tenant", help="only this tenant's captures (none: those without a tenant tag)")
    parser.add_argument("--scenario", help="only captures tagged with this scenario (none: those without one)")
    parser.add_argument("--drafter", help="only captures of requests this drafter drafted")
    parser.add_argument("--model", help="only captures of this served model")
    parser.add_argument("--below-acceptance", type=float, help="only captures whose acceptance was below this")
    parser.add_argument("--prompt-tokens", metavar="LO-HI", help="only prompts of this length band (tokens)")
    parser.add_argument(
        "--series-tag",
        help="only captures of this drift series tag: the first of --tag-keys they carry has this value "
        "(what a SpecAcceptanceDrift alert's `tag` label names)",
    )
    parser.add_argument(
        "--tag-keys", default="scenario,tenant", help="the drift detector's tag_keys (default: %(default)s)"
    )


SLICE = ("tenant", "scenario", "drafter", "model", "below_acceptance", "prompt_tokens", "series_tag")


def run_export(args: argparse.Namespace) -> int:
    params = {key: value for key in SLICE if (value := getattr(args, key)) is not None}
    if args.series_tag is not None:
        params["tag_keys"] = args.tag_keys
    rows, skipped = [], 0
    for capture in _pages(args.collector, args.token, params):
        row = speculators_row(capture, args.target_model)
        if row is None or not row["conversations"][-1]["content"]:
            skipped += 1
        else:
            rows.append(row)
    if not rows:
        raise UsageError(f"no chat captures match {params or 'any slice'} at {args.collector} ({skipped} left out)")
    _write(args.out, rows)
    print(f"wrote {len(rows)} conversations to {args.out} ({skipped} completion or empty captures left out)")
    print(
        f"next: python scripts/prepare_data.py --model {args.target_model} --data {args.out} --output DIR",
        file=sys.stderr,
    )
    return 0


def _pages(url: str, token: str | None, params: dict):
    """Every capture of the slice, page by page (`next_after_id`)."""
    headers = {"authorization": f"Bearer {token}"} if token else {}
    after: int | None = 0
    with httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=60, trust_env=False) as http:
        while after is not None:
            try:
                answer = http.get("/v1/captures", params={**params, "after_id": after})
            except httpx.HTTPError as exc:
                raise UsageError(f"cannot reach the collector at {url}: {exc}") from None
            if answer.status_code != 200:
                raise UsageError(f"the collector refused the export ({answer.status_code}): {_message(answer)}")
            page = answer.json()
            yield from page["captures"]
            after = page["next_after_id"]


def _message(answer: httpx.Response) -> str:
    try:
        detail = answer.json().get("detail")
    except ValueError:
        return answer.text[:200]
    return str(detail.get("message") if isinstance(detail, dict) else detail)[:300]


def _write(path: Path, rows: list[dict]) -> None:
    """Written beside, then renamed: a reader never sees half a file."""
    part = path.with_name(path.name + ".part")
    try:
        part.write_bytes(b"".join(orjson.dumps(row) + b"\n" for row in rows))
        part.replace(path)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror}") from None


def _progress(steps: int):
    """A line on stderr every tenth of the run."""
    every = max(1, steps // 10)
    return lambda step, loss: (
        print(f"step {step}/{steps}: loss {loss:.3f}", file=sys.stderr) if step % every == 0 else None
    )


def run_train(args: argparse.Namespace) -> int:
    """Train, save, print what it measured and how the engine serves the draft."""
    from specwatch.common.errors import require_engine

    require_engine("draft train")
    from specwatch.engine.loading import ModelLoadError, load_model

    _check_train_args(args)
    try:
        target = load_model(args.model, "float32")
        samples = _samples(args, target.tokenizer)
        init = _init_head(args, target.model)
    except (ValueError, OSError, ModelLoadError) as exc:
        raise UsageError(f"draft train: {exc}") from None
    if args.kind == "exit" and not 1 <= args.layers < target.model.config.num_hidden_layers:
        raise UsageError(f"--layers must be in [1, {target.model.config.num_hidden_layers - 1}]")
    held = min(args.held_out, len(samples) // 4)
    to_target = _vocabulary(args, target, samples[held:], init)
    if args.kind == "head":
        report = _train_head(args, target, samples, held, to_target, init)
    else:
        report = _train_exit(args, target, samples, held, to_target)
    print(_summary(args, report, len(samples) - held, to_target))
    print(f"serve it: specwatch engine serve --drafters trained=model:{args.out}", file=sys.stderr)
    return 0


def _check_train_args(args: argparse.Namespace) -> None:
    """Usage errors found before a model is loaded; the kind's defaults filled in."""
    for path in args.data:
        if not path.is_file():
            raise UsageError(f"draft train: no export file {path} (write one with `specwatch draft export`)")
    if args.draft_vocab < 0 or (args.kind == "head" and args.draft_vocab == 0):
        raise UsageError("--draft-vocab must be a positive count of tokens (0, the whole vocabulary: exit only)")
    if args.init is not None and args.kind != "head":
        raise UsageError("--init starts a head from another: it needs --kind head")
    for name, value in DEFAULTS[args.kind].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    try:
        if args.kind == "head":
            from specwatch.engine.draft_head import HeadTraining

            args.config = HeadTraining(args.steps, args.batch, args.depth, args.lr, gamma=args.gamma)
        else:
            from specwatch.engine.draft_training import TrainConfig

            args.config = TrainConfig(args.layers, args.train_layers, args.steps, args.batch, args.lr, gamma=args.gamma)
    except ValueError as exc:
        raise UsageError(f"draft train: {exc}") from None


def _samples(args: argparse.Namespace, tokenizer) -> list:
    """Every file's conversations, interleaved so that the held-out ones come from each file."""
    from specwatch.engine.draft_training import conversation_tokens

    files = [conversation_tokens(path, tokenizer, args.max_tokens) for path in args.data]
    return [sample for group in itertools.zip_longest(*files) for sample in group if sample is not None]


def _init_head(args: argparse.Namespace, target):
    if args.init is None:
        return None
    from specwatch.engine.draft_head import is_head, load_head

    if not is_head(args.init):
        raise ValueError(f"--init {args.init}: not a feature head (`draft train --kind head` writes one)")
    return load_head(args.init, target)


def _vocabulary(args: argparse.Namespace, target, samples: list, init):
    """The draft vocabulary: the data's most frequent answer tokens, the special tokens and, from --init, its own."""
    from specwatch.engine.draft_training import draft_vocabulary

    if not args.draft_vocab:
        return None
    vocab = target.model.get_output_embeddings().weight.shape[0]
    always = [*target.tokenizer.all_special_ids, *(init.to_target.tolist() if init is not None else [])]
    return draft_vocabulary(samples, args.draft_vocab, vocab, always)


def _train_head(args: argparse.Namespace, target, samples: list, held: int, to_target, init):
    from specwatch.engine.draft_head import save_head, train_head

    try:
        head, report = train_head(
            target.model, samples[held:], to_target, args.config, samples[:held], _progress(args.steps), init=init
        )
    except ValueError as exc:
        raise UsageError(f"draft train: {exc}") from None
    vocab = target.model.get_output_embeddings().weight.shape[0]
    save_head(head, args.out, vocab, _target_name(args.model))
    return report


def _train_exit(args: argparse.Namespace, target, samples: list, held: int, to_target):
    from specwatch.engine.draft_training import save_draft, train_exit

    draft, report = train_exit(
        target.model, samples[held:], args.config, samples[:held], _progress(args.steps), to_target
    )
    save_draft(draft, target.tokenizer, args.out, to_target, _target_name(args.model), args.gamma)
    return report


def _target_name(model: str) -> str:
    """The verifier named in the draft's speculators config: the bundled target's Hugging Face id, or the path."""
    return "HuggingFaceTB/SmolLM2-135M-Instruct" if model == "bundled" else model


def _summary(args: argparse.Namespace, report, conversations: int, to_target) -> str:
    vocab = f"a {len(to_target)}-token draft vocabulary" if to_target is not None else "the whole vocabulary"
    measured = "held-out: not measured"
    if report.before is not None:
        before, after = report.before, report.after
        measured = (
            f"held-out answers: agreement {before.agreement:.3f} -> {after.agreement:.3f}, "
            f"greedy acceptance at gamma {args.gamma} (replayed) {before.acceptance:.3f} -> {after.acceptance:.3f}"
        )
    what = (
        f"a feature head ({'from ' + str(args.init) + ', ' if args.init else ''}{vocab})"
        if args.kind == "head"
        else f"a {args.layers}-layer exit (top {args.train_layers} trained, {vocab})"
    )
    return (
        f"trained {what} on {conversations} conversations in {report.seconds:.0f} s: "
        f"loss {report.first_loss:.3f} -> {report.last_loss:.3f}; {measured}"
    )
