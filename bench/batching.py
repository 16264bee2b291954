"""Batched target forwards across requests vs one forward per request, side by side in one run.

    python bench/batching.py [--levels 1 2 4 8] [--max-tokens 64] [--requests-per-client 3]

One engine (bundled model) serves every cell through its OpenAI API. At each
concurrency level (slots = level, so every client's request is active at once), plain
decoding and n-gram speculation each run with the scheduler's batched verification on
and off, interleaved so drift on a shared machine hits both alike. Prints output
tokens/s per cell and the batched/unbatched ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.append(str(Path(__file__).resolve().parents[1] / "tests"))  # engine_harness

from engine_harness import BackgroundServer  # noqa: E402

from engine.engine import Engine, EngineConfig  # noqa: E402
from engine.policy import PolicyConfig  # noqa: E402
from engine.scheduler import SchedulerConfig  # noqa: E402
from specwatch.traffic import TrafficConfig, run_traffic, summary  # noqa: E402

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--levels", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--requests-per-client", type=int, default=3)
    parser.add_argument("--max-seconds", type=float, default=180.0, help="per cell")
    args = parser.parse_args()
    engine = Engine(EngineConfig(instance="bench-batching"))
    print(f"model {engine.target.name}, dtype {engine.target.dtype}, threads {engine.config.threads or 'all'}")
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
