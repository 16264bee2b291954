"""Batched target forwards across requests vs one forward per request, side by side in one run.

    python bench/batching.py [--levels 1 2 4 8] [--max-tokens 64] [--requests-per-client 3] [--mixed-only]

One engine (bundled model) serves every cell through its OpenAI API. At each
concurrency level (slots = level, so every client's request is active at once), plain
decoding and n-gram speculation each run with the scheduler's batched verification on
and off, interleaved so drift on a shared machine hits both alike. Prints output
tokens/s per cell and the batched/unbatched ratio.

Then one mixed batch at concurrency 8 (one n-gram request, gamma 4, among 7 plain ones;
the second of two runs, the first measures the step-cost curve): each side's device
time per output token under the step-cost rule (engine/device_time.py), what the token-row
rule would have charged in the same run, and the engine's measured step-cost curve.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.append(str(Path(__file__).resolve().parents[1] / "tests"))  # engine_harness

from concurrent.futures import ThreadPoolExecutor  # noqa: E402

from engine_harness import BackgroundServer  # noqa: E402

import specwatch.engine.scheduler as scheduler_module  # noqa: E402
from specwatch.engine.engine import Engine, EngineConfig  # noqa: E402
from specwatch.engine.policy import PolicyConfig  # noqa: E402
from specwatch.engine.scheduler import SchedulerConfig  # noqa: E402
from specwatch.traffic import TrafficConfig, run_traffic, summary  # noqa: E402
from specwatch.workload import COPY, LONG_ANSWERS  # noqa: E402

ALWAYS = PolicyConfig(load_off=1e9, load_on=1e9 - 1, min_acceptance=0.0, long_prompt_tokens=10**6)
SCENARIOS = ("grounded", "code-edit", "chat")


def measure(engine: Engine, level: int, drafter: str | None, batch: bool, args) -> dict:
    with BackgroundServer(engine, SchedulerConfig(slots=level, max_queue=level, batch=batch), ALWAYS) as server:
        config = TrafficConfig(
            url=server.url,
            scenarios=SCENARIOS,
            duration_s=args.max_seconds,
            max_requests=level * args.requests_per_client,
            concurrency=level,
            max_tokens=args.max_tokens,
            drafter=drafter,
            seed=level,
        )
        return summary(asyncio.run(run_traffic(config, progress=io.StringIO())))[0]


def serve_mix(engine: Engine, max_tokens: int) -> list:
    """One n-gram request among 7 plain ones, all at once on 8 slots: their records."""
    asks = [(COPY, "ngram", 4)] + [(prompt, "none", 0) for prompt in LONG_ANSWERS]
    with BackgroundServer(engine, SchedulerConfig(slots=8, max_queue=8), ALWAYS) as server:
        client = server.client()

        def ask(prompt_drafter_gamma):
            prompt, drafter, gamma = prompt_drafter_gamma
            messages = [{"role": "user", "content": prompt}]
            extra = {"drafter": drafter, "gamma": gamma}
            client.chat.completions.create(
                model=None, messages=messages, max_tokens=max_tokens, temperature=0, extra_body=extra
            )

        with ThreadPoolExecutor(len(asks)) as pool:
            list(pool.map(ask, asks))
    return server.records


def mixed_charge(engine: Engine, max_tokens: int) -> str:
    """Per-token charge of speculation among plain requests, by the step-cost rule and by token rows."""
    splits, real = [], scheduler_module.split_forward

    def recorded(seconds, rows, curve, prompt=False):  # the real split runs; the bench keeps what it did
        shares, rule = real(seconds, rows, curve, prompt)
        splits.append((seconds, list(rows), shares, rule))
        return shares, rule

    scheduler_module.split_forward = recorded
    try:
        for _ in range(2):  # the first run measures the curve at batch 8
            splits.clear()
            records = serve_mix(engine, max_tokens)
    finally:
        scheduler_module.split_forward = real
    return describe_mix(engine, records, [s for s in splits if max(s[1]) > 1])


def describe_mix(engine: Engine, records: list, mixed: list) -> str:
    spec = next(r for r in records if r.mode == "speculative")
    plain = [r for r in records if r is not spec]
    by_curve = sum(shares[rows.index(max(rows))] for _, rows, shares, _ in mixed)
    by_rows = sum(seconds * max(rows) / sum(rows) for seconds, rows, _, _ in mixed)
    plain_tokens = sum(r.output_tokens for r in plain)
    spec_ms, plain_ms = 1e3 * spec.device_s / spec.output_tokens, 1e3 * sum(r.device_s for r in plain) / plain_tokens
    spec_rows_ms = spec_ms + 1e3 * (by_rows - by_curve) / spec.output_tokens
    plain_rows_ms = plain_ms - 1e3 * (by_rows - by_curve) / plain_tokens
    per_forward = spec.output_tokens / max(spec.output_tokens - spec.num_accepted_tokens, 1)  # E
    curve = {round(x, 3): round(1e3 * t, 1) for x, t in sorted(engine.step_costs.seconds.get(8, {}).items())}
    return (
        f"c=8, 1 ngram (gamma 4) among 7 plain, {len(mixed)} mixed forwards split by "
        f"{sorted({rule for *_, rule in mixed})}: spec {spec_ms:.1f} ms/token vs plain {plain_ms:.1f} "
        f"({spec_ms / plain_ms:.2f}x); by token rows spec {spec_rows_ms:.1f} vs plain {plain_rows_ms:.1f} "
        f"({spec_rows_ms / plain_rows_ms:.2f}x); E {per_forward:.2f} tokens/forward, (gamma+1)/E {5 / per_forward:.2f}"
        f"\nstep-cost curve, batches of 5-8, rows per request -> ms per forward: {curve}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--requests-per-client", type=int, default=3)
    parser.add_argument("--max-seconds", type=float, default=180.0, help="per cell")
    parser.add_argument("--mixed-only", action="store_true", help="only the mixed batch's charges")
    parser.add_argument("--dtype", default="auto")
    args = parser.parse_args()
    engine = Engine(EngineConfig(instance="bench-batching", dtype=args.dtype))
    print(f"model {engine.target.name}, dtype {engine.target.dtype}, threads {engine.config.threads or 'all'}")
    if not args.mixed_only:
        throughput_table(engine, args)
    print(mixed_charge(engine, args.max_tokens), flush=True)


def throughput_table(engine: Engine, args) -> None:
    print(f"{'level':>5} {'drafter':<7} {'batched tok/s':>13} {'one-by-one tok/s':>16} {'ratio':>6}")
    for level in args.levels:
        for drafter in (None, "ngram"):
            on = measure(engine, level, drafter, True, args)
            off = measure(engine, level, drafter, False, args)
            ratio = on["output_tokens_per_s"] / max(off["output_tokens_per_s"], 1e-9)
            errors = on["errors"] + off["errors"]
            print(
                f"{level:>5} {drafter or 'none':<7} {on['output_tokens_per_s']:>13.1f} "
                f"{off['output_tokens_per_s']:>16.1f} "
                f"{ratio:>5.2f}x" + (f"  ({errors} errors)" if errors else ""),
                flush=True,
            )


if __name__ == "__main__":
    main()
