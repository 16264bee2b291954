"""`specwatch generate`: one request through the engine, printing the text and its telemetry record."""

from __future__ import annotations

import argparse
import json
import sys

from specwatch.cli import UsageError


def register(subparsers: argparse._SubParsersAction) -> None:
    gen = subparsers.add_parser("generate", help="generate text with speculative decoding and print its telemetry")
    gen.add_argument("--prompt", required=True, help="the user message (or raw text with --raw)")
    gen.add_argument("--raw", action="store_true", help="send the prompt as plain text, without the chat template")
    gen.add_argument("--drafter", default="ngram", help="none | ngram | model:PATH | early-exit:K (default: ngram)")
    gen.add_argument("--gamma", type=int, default=8, help="tokens drafted per round (default: 8)")
    gen.add_argument("--max-tokens", type=int, default=128)
    gen.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    gen.add_argument("--top-p", type=float, default=1.0)
    gen.add_argument("--top-k", type=int, default=0)
    gen.add_argument("--seed", type=int, default=None)
    gen.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")
    add_model_arguments(gen)
    gen.add_argument("--json", action="store_true", help="print one JSON object: text, finish_reason, record")
    gen.set_defaults(handler=run_generate)


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="bundled", help="bundled | PATH.gguf | HF model directory (default: bundled)")
    parser.add_argument("--dtype", default="auto", help="auto | bfloat16 | float32 | float16")
    parser.add_argument("--device", default="cpu", help="cpu | cuda | auto")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (default: all cores)")


def engine_config(args: argparse.Namespace):
    from engine.engine import EngineConfig

    if args.threads < 0:
        raise UsageError("--threads must be >= 0")
    return EngineConfig(model=args.model, dtype=args.dtype, device=args.device, threads=args.threads)


def run_generate(args: argparse.Namespace) -> int:
    from engine.engine import Engine, GenerateRequest
    from engine.loading import ModelLoadError
    from engine.sampling import SamplingParams

    try:
        sampling = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
        content = {"prompt": args.prompt} if args.raw else {"messages": [{"role": "user", "content": args.prompt}]}
        drafter = None if args.drafter == "none" else args.drafter
        request = GenerateRequest(**content, max_tokens=args.max_tokens, drafter=drafter, gamma=args.gamma,
                                  sampling=sampling, stop=tuple(args.stop), seed=args.seed)
        engine = Engine(engine_config(args))
        engine.drafter(request.drafter)  # a bad drafter spec fails here, before any output
    except (ValueError, ModelLoadError) as exc:
        raise UsageError(str(exc)) from exc
    return _print_stream(engine, request, args.json)


def _print_stream(engine, request, as_json: bool) -> int:
    from engine.engine import GenerateResult

    for piece in engine.stream(request):
        if isinstance(piece, GenerateResult):
            result = piece
        elif not as_json:
            print(piece, end="", flush=True)
    if as_json:
        payload = {"text": result.text, "finish_reason": result.finish_reason, "record": result.record.model_dump(mode="json")}
        print(json.dumps(payload, indent=2))
    else:
        print(f"\n\n{json.dumps(result.record.model_dump(mode='json'))}", file=sys.stderr)
        print(summary_line(result.record), file=sys.stderr)
    return 0


def summary_line(record) -> str:
    """One human line for a request record."""
    rate = f"{record.acceptance_rate:.2f}" if record.acceptance_rate is not None else "n/a"
    decode_s = max(record.e2e_s - (record.ttft_s or 0.0), 1e-9)
    return (
        f"[{record.mode} drafter={record.drafter} gamma={record.gamma}] {record.output_tokens} tokens in {record.e2e_s:.2f}s "
        f"({record.output_tokens / max(record.e2e_s, 1e-9):.1f} tok/s, decode {record.output_tokens / decode_s:.1f} tok/s), "
        f"ttft {1000 * (record.ttft_s or 0):.0f} ms, acceptance {rate}"
    )
