"""Engine benchmark: own plain vs own speculative (every drafter, both lookahead rules) vs
transformers generate(), on the bundled SmolLM2-135M-Instruct, greedy, side by side in one run.

    python bench/engine.py [--dtype auto] [--max-tokens 128] [--repeats 3] [--configs SUBSTR ...]
                           [--repeated 20] [--compile] [--json out.json]

Configurations are interleaved within each repeat, so machine noise hits them alike;
the median per configuration is reported. Speed-ups are against own plain decoding
on the same prompt, measured in the same run. The `suffix` drafter starts every
single-prompt run with an empty cross-request memory (it would otherwise have seen
the same prompt's answer in the previous repeat); `--repeated N` then sends N
templated requests twice, where the second pass may gain from that memory.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from specwatch.engine.drafters import model_drafter, truncated_copy  # noqa: E402
from specwatch.engine.engine import Engine, EngineConfig, GenerateRequest  # noqa: E402
from specwatch.engine.suffix import SuffixCache  # noqa: E402
from specwatch.workload import PROMPTS, chat  # noqa: E402

NAMES = ("Dana", "Luis", "Mei", "Omar", "Priya", "Tom", "Ana", "Kofi", "Sara", "Ivan")
ITEMS = ("ergonomic chairs", "standing desks", "monitor arms", "desk lamps", "filing cabinets")


def templated_requests(count: int) -> list[list[dict[str, str]]]:
    """`count` support-reply requests from one template (names, items, dates vary): the shape of an
    agent or a help desk, whose answers repeat each other more than they repeat their prompts."""
    return [
        [
            {
                "role": "user",
                "content": f"Write a short, polite reply to {NAMES[i % len(NAMES)]}: order #{48200 + 7 * i} "
                f"of {2 + i % 4} {ITEMS[i % len(ITEMS)]} has shipped and arrives on {3 + i % 25} March. "
                "Thank them and give the support phone number 0800 555 0199.",
            }
        ]
        for i in range(count)
    ]


@dataclass
class Runs:
    seconds: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    accepted: int = 0
    drafted: int = 0
    drafts: int = 0
    output: list[int] | None = None

    def tokens_per_s(self) -> float:
        return statistics.median(t / s for t, s in zip(self.tokens, self.seconds))


def own(
    engine: Engine,
    prompt_ids,
    drafter: str | None,
    gamma: int,
    max_tokens: int,
    runs: Runs,
    messages,
    lookahead: str = "heuristic",
    memory: SuffixCache | None = None,
) -> None:
    """One request through our engine, with this lookahead rule and (suffix) this cross-request memory:
    a fresh one unless given, so that no run learns from another configuration's output."""
    request = GenerateRequest(messages=messages, max_tokens=max_tokens, drafter=drafter, gamma=gamma)
    engine.config = dataclasses.replace(engine.config, lookahead=lookahead)
    engine.suffix_cache = memory if memory is not None else SuffixCache(engine.config.suffix)
    engine.drafter("suffix").cache = engine.suffix_cache  # the slot's drafter reads what the engine learns into
    result = engine.generate(request)
    record = result.record
    runs.seconds.append(record.e2e_s)
    runs.tokens.append(record.output_tokens)
    runs.accepted += record.num_accepted_tokens
    runs.drafted += record.num_draft_tokens
    runs.drafts += record.num_drafts
    runs.output = result.token_ids


def hf(engine: Engine, prompt_ids, max_tokens: int, runs: Runs, **kwargs) -> None:
    ids = torch.tensor([prompt_ids], device=engine.target.device)
    started = time.monotonic()
    with torch.inference_mode():
        out = engine.target.model.generate(
            ids, attention_mask=torch.ones_like(ids), max_new_tokens=max_tokens, do_sample=False, **kwargs
        )
    runs.seconds.append(time.monotonic() - started)
    generated = out[0, len(prompt_ids) :].tolist()
    runs.tokens.append(len(generated))
    runs.output = generated


def configurations(engine: Engine, args) -> dict:
    draft_model = truncated_copy(engine.target.model, args.exit_layer)
    # the same lookahead as ours (transformers' default drafts up to 20 tokens with a confidence cut-off)
    draft_model.generation_config.num_assistant_tokens = args.exit_gamma
    draft_model.generation_config.num_assistant_tokens_schedule = "constant"
    draft_model.generation_config.assistant_confidence_threshold = 0.0
    engine.add_drafter(
        "model:first-layers", model_drafter(draft_model, engine.target.model, f"first-{args.exit_layer}-layers")
    )
    g, k = args.gamma, args.exit_gamma
    configs = {
        "own plain": lambda ids, m, r: own(engine, ids, None, 0, args.max_tokens, r, m),
        f"own ngram g={g}": lambda ids, m, r: own(engine, ids, "ngram", g, args.max_tokens, r, m),
        f"own ngram g={g} cost-lookahead": lambda ids, m, r: own(
            engine, ids, "ngram", g, args.max_tokens, r, m, "cost"
        ),
        f"own suffix g={g}": lambda ids, m, r: own(engine, ids, "suffix", g, args.max_tokens, r, m),
        f"own suffix g={g} cost-lookahead": lambda ids, m, r: own(
            engine, ids, "suffix", g, args.max_tokens, r, m, "cost"
        ),
        f"own early-exit:{args.exit_layer} g={k}": lambda ids, m, r: own(
            engine, ids, f"early-exit:{args.exit_layer}", k, args.max_tokens, r, m
        ),
        f"own early-exit:{args.exit_layer} g={k} cost-lookahead": lambda ids, m, r: own(
            engine, ids, f"early-exit:{args.exit_layer}", k, args.max_tokens, r, m, "cost"
        ),
        f"own model(first {args.exit_layer} layers) g={k}": lambda ids, m, r: own(
            engine, ids, "model:first-layers", k, args.max_tokens, r, m
        ),
        "hf generate plain": lambda ids, m, r: hf(engine, ids, args.max_tokens, r),
        f"hf prompt_lookup={g}": lambda ids, m, r: hf(engine, ids, args.max_tokens, r, prompt_lookup_num_tokens=g),
        f"hf assistant(first {args.exit_layer} layers) g={k}": lambda ids, m, r: hf(
            engine, ids, args.max_tokens, r, assistant_model=draft_model
        ),
    }
    chosen = {name: run for name, run in configs.items() if name == "own plain" or _wanted(name, args.configs)}
    return chosen


def _wanted(name: str, patterns: list[str] | None) -> bool:
    return patterns is None or any(pattern in name for pattern in patterns)


def measure(engine: Engine, args) -> dict[str, dict[str, Runs]]:
    configs = configurations(engine, args)
    results = {kind: {name: Runs() for name in configs} for kind in args.prompts}
    for repeat in range(args.repeats + 1):  # repeat 0 warms up every shape and is discarded
        for kind in args.prompts:
            messages = chat(kind)
            prompt_ids = engine.encode(GenerateRequest(messages=messages))
            for name, run in configs.items():
                runs = results[kind][name] if repeat else Runs()
                run(prompt_ids, messages, runs)
        print(f"  repeat {repeat}/{args.repeats} done", file=sys.stderr, flush=True)
    return results


def repeated_workload(engine: Engine, args) -> list[dict]:
    """The same `args.repeated` templated requests sent twice, plain vs ngram vs suffix (each with its own
    cross-request memory, kept across both passes), request by request interleaved; tokens/s per pass."""
    requests = templated_requests(args.repeated)
    g, lookahead = args.gamma, args.repeated_lookahead
    memory = SuffixCache(engine.config.suffix)
    configs = {
        "own plain": lambda m, r: own(engine, None, None, 0, args.max_tokens, r, m),
        f"own ngram g={g}": lambda m, r: own(engine, None, "ngram", g, args.max_tokens, r, m, lookahead),
        f"own suffix g={g}": lambda m, r: own(engine, None, "suffix", g, args.max_tokens, r, m, lookahead, memory),
    }
    own(engine, None, None, 0, 8, Runs(), requests[0])  # warm-up, not counted
    rows = []
    print(f"\nrepeated workload: {len(requests)} templated requests sent twice ({lookahead} lookahead)")
    print(f"{'pass':<5} {'configuration':<34} {'tok/s':>7} {'vs own plain':>12} {'accept':>7} {'= plain':>8}")
    for n in (1, 2):
        runs = {name: Runs() for name in configs}
        outputs = {name: [] for name in configs}
        for messages in requests:
            for name, run in configs.items():
                run(messages, runs[name])
                outputs[name].append(runs[name].output)
        for name, r in runs.items():
            rate = sum(r.tokens) / sum(r.seconds)  # the pass's throughput: total tokens / total seconds
            base = sum(runs["own plain"].tokens) / sum(runs["own plain"].seconds)
            row = {
                "pass": n,
                "config": name,
                "tokens_per_s": rate,
                "speedup_vs_own_plain": rate / base,
                "acceptance_rate": r.accepted / r.drafted if r.drafted else None,
                "identical_to_own_plain": outputs[name] == outputs["own plain"],
            }
            rows.append(row)
            acc = f"{row['acceptance_rate']:.2f}" if row["acceptance_rate"] is not None else "-"
            same = "yes" if row["identical_to_own_plain"] else "no"
            print(f"{n:<5} {name:<34} {rate:7.1f} {row['speedup_vs_own_plain']:11.2f}x {acc:>7} {same:>8}")
        print(f"  pass {n}/2 done", file=sys.stderr, flush=True)
    return rows


def report(results: dict[str, dict[str, Runs]]) -> list[dict]:
    rows = []
    print(
        f"\n{'prompt':<10} {'configuration':<34} {'tok/s':>7} {'vs own plain':>12} "
        f"{'accept':>7} {'mean len':>8} {'= plain':>9}"
    )
    for kind, configs in results.items():
        base = configs["own plain"]
        for name, runs in configs.items():
            row = {
                "prompt": kind,
                "config": name,
                "tokens_per_s": runs.tokens_per_s(),
                "speedup_vs_own_plain": runs.tokens_per_s() / base.tokens_per_s(),
                "acceptance_rate": runs.accepted / runs.drafted if runs.drafted else None,
                "mean_acceptance_length": 1 + runs.accepted / runs.drafts if runs.drafts else None,
                "identical_to_own_plain": runs.output == base.output,
                "first_divergence": first_divergence(runs.output, base.output),
            }
            rows.append(row)
            acc = f"{row['acceptance_rate']:.2f}" if row["acceptance_rate"] is not None else "-"
            mal = f"{row['mean_acceptance_length']:.2f}" if row["mean_acceptance_length"] is not None else "-"
            print(
                f"{kind:<10} {name:<34} {row['tokens_per_s']:7.1f} {row['speedup_vs_own_plain']:11.2f}x "
                f"{acc:>7} {mal:>8} {identity(row):>9}"
            )
    return rows


def read_bandwidth_gbps(megabytes: int = 512, repeats: int = 5) -> float:
    """Memory read bandwidth: the best of a few full passes (sum) over a buffer far larger than the caches."""
    buffer = torch.ones(megabytes * 2**20 // 4, dtype=torch.float32)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        buffer.sum()
        best = min(best, time.perf_counter() - started)
    return buffer.numel() * 4 / best / 1e9


def bandwidth_bound(engine: Engine, results: dict[str, dict[str, Runs]]) -> dict:
    """Plain decoding against the bound of reading every weight once per token."""
    weight_bytes = sum(p.numel() * p.element_size() for p in engine.target.model.parameters())
    bandwidth = read_bandwidth_gbps()
    bound = bandwidth * 1e9 / weight_bytes
    plain = statistics.median(configs["own plain"].tokens_per_s() for configs in results.values())
    print(
        f"\nplain decoding {plain:.1f} tok/s vs memory-bandwidth bound {bound:.1f} tok/s "
        f"({weight_bytes / 1e6:.0f} MB of weights per token, {bandwidth:.1f} GB/s read here): {plain / bound:.2f}"
    )
    return {"plain_tokens_per_s": plain, "bound_tokens_per_s": bound, "ratio": plain / bound, "read_gbps": bandwidth}


def first_divergence(output: list[int] | None, reference: list[int] | None) -> int | None:
    """Index of the first token that differs from the reference (None when identical)."""
    if output == reference:
        return None
    pairs = zip(output or [], reference or [])
    return next((i for i, (a, b) in enumerate(pairs) if a != b), min(len(output or []), len(reference or [])))


def identity(row: dict) -> str:
    return "yes" if row["identical_to_own_plain"] else f"no@{row['first_divergence']}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gamma", type=int, default=8, help="draft length for n-gram / prompt lookup")
    parser.add_argument("--exit-layer", type=int, default=12, help="layers kept by the early-exit / truncated draft")
    parser.add_argument("--exit-gamma", type=int, default=3)
    parser.add_argument(
        "--prompts",
        nargs="*",
        default=["grounded", "code-edit", "summary", "extraction", "chat"],
        choices=list(PROMPTS),
        help="single prompts, each run by every configuration (none: skip this part)",
    )
    parser.add_argument(
        "--configs", nargs="+", help="only configurations whose name contains one of these (own plain always runs)"
    )
    parser.add_argument(
        "--repeated", type=int, default=20, help="templated requests sent twice after the single prompts (0: skip)"
    )
    parser.add_argument("--repeated-lookahead", choices=("cost", "heuristic", "fixed"), default="cost")
    parser.add_argument("--compile", action="store_true", help="our decode step and verification through torch.compile")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args()
    engine = Engine(EngineConfig(dtype=args.dtype, threads=args.threads, instance="bench", compile=args.compile))
    print(
        f"model {engine.target.name} dtype {engine.target.dtype} threads {torch.get_num_threads()} "
        f"decode step and verification {'eager' if engine.compile_s is None else 'compiled'} "
        f"cold start {engine.target.cold_start_s:.2f}s (cached copy: {engine.target.from_cache})",
        file=sys.stderr,
    )
    out = {}
    if args.prompts:
        results = measure(engine, args)
        out["rows"] = report(results)
        out["bandwidth_bound"] = bandwidth_bound(engine, results)
    if args.repeated:
        out["repeated"] = repeated_workload(engine, args)
    if args.json:
        args.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
