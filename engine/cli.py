"""`specwatch generate`: one request through the engine, printing the text and its telemetry record."""

from __future__ import annotations

import argparse
import dataclasses
import json
import socket
import sys
from pathlib import Path

from specwatch.common.cli import (
    add_capture_arguments,
    add_exposure_arguments,
    add_producer_arguments,
    check_exposure,
    tcp_port,
)
from specwatch.common.errors import UsageError, require_engine
from specwatch.engine.lookahead import DEFAULT_DRAFT_FLOOR, check_draft_floor
from specwatch.engine.policy import PolicyConfig


def register(subparsers: argparse._SubParsersAction) -> None:
    _register_generate(subparsers)
    _register_serve(subparsers)


def _register_generate(subparsers: argparse._SubParsersAction) -> None:
    gen = subparsers.add_parser("generate", help="generate text with speculative decoding and print its telemetry")
    gen.add_argument("--prompt", required=True, help="the user message (or raw text with --raw)")
    gen.add_argument("--raw", action="store_true", help="send the prompt as plain text, without the chat template")
    gen.add_argument(
        "--drafter", default="ngram", help="none | ngram | suffix | model:PATH | early-exit:K (default: ngram)"
    )
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


def _register_serve(subparsers: argparse._SubParsersAction) -> None:
    engine = subparsers.add_parser("engine", help="the speculative-decoding engine")
    engine_commands = engine.add_subparsers(dest="engine_command", required=True, metavar="SUBCOMMAND")
    serve = engine_commands.add_parser("serve", help="serve the OpenAI-compatible API")
    add_model_arguments(serve)
    add_exposure_arguments(serve)
    serve.add_argument("--port", type=tcp_port, default=8000)
    serve.add_argument("--slots", type=int, default=4, help="requests decoded concurrently (default: 4)")
    serve.add_argument("--max-queue", type=int, default=64, help="waiting requests before 429 (default: 64)")
    serve.add_argument(
        "--shutdown-timeout",
        type=float,
        default=30.0,
        help="on SIGTERM/SIGINT, seconds in-flight requests may finish before they are cancelled (default: 30)",
    )
    add_producer_arguments(serve, Path("data/engine-spool"))
    add_capture_arguments(serve)
    serve.add_argument("--instance", default=socket.gethostname())
    serve.add_argument("--sample-interval", type=float, default=5.0, help="seconds between device samples")
    serve.add_argument("--load-off", type=float, default=0.75, help="speculation off above this load (default: 0.75)")
    serve.add_argument("--load-on", type=float, default=0.60, help="...and back on below this (default: 0.60)")
    serve.add_argument("--long-prompt-tokens", type=int, default=512)
    serve.add_argument(
        "--canary-fraction", type=float, default=1.0, help="share of requests that speculate (A/B arms when < 1)"
    )
    serve.add_argument("--min-acceptance", type=float, default=0.3)
    _add_selector_and_memory_arguments(serve)
    serve.add_argument(
        "--drafters",
        nargs="+",
        default=[],
        metavar="NAME=model:PATH",
        help="draft models a request may name in its `drafter` (requests never pass paths); loaded at start",
    )
    serve.add_argument(
        "--default-drafter",
        default="ngram",
        help="drafter of requests that name none: none | ngram | suffix | early-exit:K | auto | a --drafters NAME "
        "(default: ngram; none: a plain upstream behind `specwatch gateway`)",
    )
    serve.add_argument(
        "--max-prompt-tokens",
        type=_positive_int,
        default=None,
        help="refuse longer prompts with 400 context_length_exceeded (default: the model's context less max_tokens)",
    )
    serve.set_defaults(handler=run_serve)


def _positive_int(value: str) -> int:
    if not value.isdecimal() or int(value) < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a positive integer")
    return int(value)


def _add_selector_and_memory_arguments(serve: argparse.ArgumentParser) -> None:
    """Drafter 'auto', batching and the memory guard's thresholds."""
    serve.add_argument(
        "--candidates",
        nargs="+",
        default=list(PolicyConfig.candidates),
        metavar="DRAFTER[@GAMMA]",
        help="what requests with drafter 'auto' choose from, per scenario tag (default: %(default)s)",
    )
    serve.add_argument(
        "--explore", type=float, default=0.1, help="share of 'auto' requests that try a non-best candidate"
    )
    serve.add_argument(
        "--no-batch",
        dest="batch",
        action="store_false",
        help="verify each request in its own target forward (default: one batched forward per round)",
    )
    serve.add_argument(
        "--prefill-chunk",
        type=int,
        default=0,
        help="batched: at most N prompt tokens a round beside requests that decode, so that a long prompt "
        "stalls them for less at a time, at some throughput (default 0: whole prompts)",
    )
    serve.add_argument(
        "--memory-high",
        type=float,
        default=0.90,
        help="unload the draft models above this share of device memory in use (default 0.90; 1 = never)",
    )
    serve.add_argument(
        "--memory-low", type=float, default=0.80, help="...and load them again below this share (default 0.80)"
    )


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--model", default="bundled", help="bundled | PATH.gguf | HF model directory (default: bundled)"
    )
    parser.add_argument("--dtype", default="auto", help="auto | bfloat16 | float32 | float16")
    parser.add_argument("--device", default="cpu", help="cpu | cuda | auto")
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch threads, fixed (default: per forward, the physical cores other processes leave free; "
        "engine/threads.py)",
    )
    parser.add_argument(
        "--batch-threads",
        type=int,
        default=0,
        help="torch threads for a forward that verifies several requests at once (default: --threads; "
        "engine/threads.py)",
    )
    parser.add_argument(
        "--compile",
        action="store_true",
        help="on a CPU (float32, or bfloat16 where oneDNN packs it): run the decode step, a whole prompt and the "
        "verification of drafts through torch.compile "
        "(~5 min on the first start on a 2-core machine, ~80 s later: Inductor's on-disk cache; docs/benchmarks.md)",
    )
    parser.add_argument(
        "--memory-fraction",
        type=float,
        default=0.8,
        help="CUDA: cap this process at this share of device memory (default 0.8; ignored on a CPU)",
    )
    parser.add_argument(
        "--suffix-requests",
        type=int,
        default=64,
        help="the suffix drafter remembers the outputs of this many finished requests (default: 64)",
    )
    parser.add_argument(
        "--lookahead",
        choices=("cost", "heuristic", "fixed"),
        default=None,
        help="draft length per round: cost (maximise expected tokens/s from the measured verify cost and "
        "acceptance; the default), heuristic (+2 after a full accept, -1 after a rejection) or fixed (always --gamma)",
    )
    parser.add_argument(
        "--draft-floor",
        type=float,
        default=DEFAULT_DRAFT_FLOOR,
        help="with --lookahead cost: a drafter that sizes its drafts (a trained head, suffix) has no token verified "
        f"that it gives less chance of acceptance than this (default {DEFAULT_DRAFT_FLOOR}; 0: the tokens/s optimum)",
    )


def engine_config(args: argparse.Namespace):
    from specwatch.engine.engine import EngineConfig

    if args.threads < 0 or args.batch_threads < 0:
        raise UsageError("--threads and --batch-threads must be >= 0")
    try:
        check_draft_floor(getattr(args, "draft_floor", DEFAULT_DRAFT_FLOOR))
    except ValueError as exc:
        raise UsageError(f"--draft-floor: {exc}") from None
    from specwatch.engine.suffix import SuffixConfig

    try:
        suffix = SuffixConfig(max_requests=getattr(args, "suffix_requests", 64))
    except ValueError as exc:
        raise UsageError(f"--suffix-requests: {exc}") from None
    try:
        lookahead = getattr(args, "lookahead", None) or EngineConfig.lookahead
        return _options_for(EngineConfig, args, suffix=suffix, lookahead=lookahead)
    except ValueError as exc:
        raise UsageError(f"--memory-fraction: {exc}") from None


def run_generate(args: argparse.Namespace) -> int:
    require_engine("generate")
    from specwatch.engine.engine import Engine, GenerateRequest
    from specwatch.engine.loading import ModelLoadError
    from specwatch.engine.sampling import SamplingParams

    try:
        sampling = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p)
        content = {"prompt": args.prompt} if args.raw else {"messages": [{"role": "user", "content": args.prompt}]}
        drafter = None if args.drafter == "none" else args.drafter
        request = GenerateRequest(
            **content,
            max_tokens=args.max_tokens,
            drafter=drafter,
            gamma=args.gamma,
            sampling=sampling,
            stop=tuple(args.stop),
            seed=args.seed,
        )
        engine = Engine(engine_config(args))
        engine.drafter(request.drafter)  # a bad drafter spec fails here, before any output
        engine.encode(request)  # ...and a prompt too long for the model's context
    except (ValueError, ModelLoadError) as exc:
        raise UsageError(str(exc)) from exc
    return _print_stream(engine, request, args.json)


def _print_stream(engine, request, as_json: bool) -> int:
    from specwatch.engine.engine import GenerateResult

    for piece in engine.stream(request):
        if isinstance(piece, GenerateResult):
            result = piece
        elif not as_json:
            print(piece, end="", flush=True)
    if as_json:
        payload = {
            "text": result.text,
            "finish_reason": result.finish_reason,
            "record": result.record.model_dump(mode="json"),
        }
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
        f"[{record.mode} drafter={record.drafter} gamma={record.gamma}] "
        f"{record.output_tokens} tokens in {record.e2e_s:.2f}s "
        f"({record.output_tokens / max(record.e2e_s, 1e-9):.1f} tok/s, "
        f"decode {record.output_tokens / decode_s:.1f} tok/s), "
        f"ttft {1000 * (record.ttft_s or 0):.0f} ms, acceptance {rate}"
    )


def run_serve(args: argparse.Namespace) -> int:
    require_engine("engine serve")
    from specwatch.engine import markers
    from specwatch.engine.device import DeviceSampler
    from specwatch.engine.engine import Engine
    from specwatch.engine.loading import ModelLoadError
    from specwatch.engine.memory_guard import MemoryGuard
    from specwatch.engine.policy import Policy
    from specwatch.engine.scheduler import Scheduler
    from specwatch.engine.server import create_app
    from specwatch.engine.shutdown import serve_until_signal
    from specwatch.engine.step_cost_events import StepCostEvents
    from specwatch.telemetry import spans
    from specwatch.telemetry.capture_client import capture_setup
    from specwatch.telemetry.client import TelemetryClient
    from specwatch.telemetry.sink import TelemetrySink

    check_exposure("engine", args)  # before the model loads
    if not 0 <= args.shutdown_timeout <= 86_400:
        raise UsageError("--shutdown-timeout must be between 0 and 86400 seconds")
    try:
        policy_config, scheduler_config, guard_config, engine_config = _serve_configs(args)
        client = TelemetryClient(args.collector, args.spool_dir, args.collector_token) if args.collector else None
        capturer, captures = capture_setup(
            args.capture, args.capture_redact, args.capture_hook, args.collector, args.collector_token
        )
        engine = Engine(engine_config)
        drafters = register_drafters(engine, args.drafters)
    except (ValueError, ModelLoadError) as exc:
        raise UsageError(str(exc)) from exc
    sink = TelemetrySink(args.instance, client, spans.RequestSpans.from_env("specwatch-engine"), capturer, captures)
    policy = Policy(policy_config, sink=sink)
    scheduler = Scheduler(engine, scheduler_config, policy, sink)
    cold_start = {"model": engine.target.name, "from_cache": engine.target.from_cache}
    sink.emit("cold_start", cold_start, engine.target.cold_start_s)
    marker = markers.identity(engine, args.default_drafter, drafters)  # version, model hash, drafters
    sink.emit("config", _config_detail(engine, policy, scheduler_config) | marker)
    if client:
        sampler = DeviceSampler(scheduler, sink, args.sample_interval)
        sampler.start()
        step_costs = StepCostEvents(engine.step_costs, sink.emit)  # the curve, for the cost model
        step_costs.start()
    print(
        f"engine: {engine.target.name} ({engine.target.dtype}) on http://{args.host}:{args.port}/v1, "
        f"telemetry -> {args.collector or 'off'}, spans -> {spans.endpoint() if sink.spans else 'off'}",
        file=sys.stderr,
        flush=True,
    )
    try:
        app = create_app(
            scheduler,
            engine.target.name,
            args.control_token,
            drafters=drafters,
            default_drafter=args.default_drafter,
            api_key=args.api_key,
        )
    except ValueError as exc:
        raise UsageError(f"--default-drafter: {exc}") from None
    guard = MemoryGuard(scheduler, guard_config)
    guard.start()
    try:
        serve_until_signal(app, scheduler, args.host, args.port, args.shutdown_timeout)
    finally:
        scheduler.stop()  # already stopped by the app's lifespan, unless a second Ctrl-C forced the exit
        guard.stop()
        if client:
            sampler.stop()
            step_costs.stop()  # the curve as it ends
            client.close()
        if captures:
            captures.close()
    return 0


def register_drafters(engine, items: list[str]) -> dict[str, str]:
    """{name: spec} from `--drafters NAME=model:PATH ...`, each draft model loaded now (ValueError when bad)."""
    import re

    from specwatch.engine.bodies import BUILTIN_DRAFTERS

    drafters = {}
    for item in items:
        name, _, spec = item.partition("=")
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}", name) or not spec.startswith("model:"):
            raise ValueError(f"--drafters {item!r}: expected NAME=model:PATH, NAME of letters, digits, '_.-'")
        if name in BUILTIN_DRAFTERS:
            raise ValueError(f"--drafters {item!r}: {name!r} is a built-in drafter's name")
        engine.check_drafter(spec)
        engine.drafter(spec)  # load the weights now: a bad model fails here, not on a request
        drafters[name] = spec
    return drafters


def _serve_configs(args: argparse.Namespace) -> tuple:
    """Policy, scheduler, memory guard and engine configs from `engine serve`'s options (ValueError when bad)."""
    from specwatch.engine.memory_guard import MemoryGuardConfig
    from specwatch.engine.scheduler import SchedulerConfig

    policy = _options_for(PolicyConfig, args, candidates=tuple(args.candidates))
    scheduler = SchedulerConfig(
        slots=args.slots, max_queue=args.max_queue, batch=args.batch, prefill_chunk=args.prefill_chunk
    )
    guard = MemoryGuardConfig(high=args.memory_high, low=args.memory_low)
    return policy, scheduler, guard, engine_config(args)


def _options_for(config_type: type, args: argparse.Namespace, **overrides):
    """A config dataclass from the command-line options named like its fields (the rest keep their defaults)."""
    options = {f.name: getattr(args, f.name) for f in dataclasses.fields(config_type) if hasattr(args, f.name)}
    return config_type(**{**options, **overrides})


def _config_detail(engine, policy, scheduler_config) -> dict:
    import torch
    import transformers

    return {
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
        "dtype": str(engine.target.dtype).removeprefix("torch."),
        "threads": engine.threads,
        "batch_threads": engine.batch_threads,
        "slots": scheduler_config.slots,
        "max_queue": scheduler_config.max_queue,
        "policy": dataclasses.asdict(policy.config),
        "memory_fraction": engine.memory_fraction,
        "streams": engine.streams.describe(),
    }
