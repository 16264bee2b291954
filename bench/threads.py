"""Torch threads against contention: the bundled model's decode step, quiet and beside busy processes.

    python bench/threads.py [--threads 1 2] [--busy 1] [--rounds 4] [--steps 40] [--context 300] [--compile]

For each thread count, one worker process holds the model (bf16 by default) and times --steps
decode steps (one token each, after a --context token prefill; --compile: the compiled step,
EngineConfig.compile); the rounds alternate a quiet
machine with one where --busy processes spin on the CPU (each a plain Python loop), so the
machine's own drift hits every configuration alike. Printed: median ms per step, quiet and
contended, and contended / quiet, per thread count. Why it matters: OpenMP threads that wait on
each other at every kernel lose far more than their share of the CPU once another process runs on
one of their cores (engine/threads.py picks the default from this).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _spin(stop) -> None:
    while not stop.is_set():
        pass


def _worker(threads: int, dtype: str, context: int, steps: int, compiled: bool, jobs, results) -> None:
    import torch

    from specwatch.engine.decoder import make_decoder, warm_up
    from specwatch.engine.loading import load_model
    from specwatch.engine.threads import CpuShare, physical_cores, using

    share = None if threads else CpuShare()  # 0: the engine's default, per forward
    torch.set_num_threads(threads or physical_cores())
    decoder = make_decoder(load_model(dtype=dtype).model, for_compile=compiled)  # as the engine builds it
    if compiled:
        if not getattr(decoder, "compilable", False):
            raise SystemExit(f"--compile: no compiled forwards for {dtype} on this machine (engine/decoder.py)")
        decoder.compiled = True
        warm_up(decoder)
    token = torch.tensor([42])
    while (job := jobs.get()) is not None:
        decoder.reset(context + steps + 1)
        decoder.forward(torch.randint(0, 1000, (context,)), keep=1)
        times, used = [], []
        for _ in range(steps):
            used.append(share.threads() if share else threads)
            started = time.perf_counter()
            with using(used[-1]):
                decoder.forward(token)
            times.append(time.perf_counter() - started)
        results.put((job, statistics.median(times) * 1000, statistics.mean(used)))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--threads",
        type=int,
        nargs="+",
        default=[1, os.cpu_count() or 1, 0],
        help="counts to compare; 0: the engine's default (engine.threads.CpuShare, chosen per step)",
    )
    parser.add_argument("--busy", type=int, default=1, help="spinning processes in the contended rounds")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--context", type=int, default=300)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--compile", action="store_true", help="time the compiled decode step (EngineConfig.compile)")
    args = parser.parse_args()
    if min(args.threads) < 0 or args.busy < 1 or args.rounds < 1 or args.steps < 1 or args.context < 1:
        parser.error("--threads must be >= 0; --busy, --rounds, --steps and --context >= 1")
    print(f"load average before: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)", file=sys.stderr)
    ctx = mp.get_context("spawn")
    workers = {}
    for threads in args.threads:
        jobs, results = ctx.Queue(), ctx.Queue()
        process = ctx.Process(
            target=_worker,
            args=(threads, args.dtype, args.context, args.steps, args.compile, jobs, results),
        )
        process.start()
        workers[threads] = (process, jobs, results)
    times: dict[tuple[int, bool], list[float]] = {(t, c): [] for t in args.threads for c in (False, True)}
    used: dict[tuple[int, bool], list[float]] = {key: [] for key in times}
    try:
        for round_ in range(args.rounds + 1):  # round 0 warms up and is dropped
            for contended in (False, True):
                stop = ctx.Event()
                spinners = [ctx.Process(target=_spin, args=(stop,)) for _ in range(args.busy if contended else 0)]
                for spinner in spinners:
                    spinner.start()
                for threads, (_, jobs, results) in workers.items():
                    jobs.put(round_)
                    _, ms, mean_threads = results.get(timeout=600)
                    if round_:
                        times[(threads, contended)].append(ms)
                        used[(threads, contended)].append(mean_threads)
                stop.set()
                for spinner in spinners:
                    spinner.join()
            print(f"  round {round_}/{args.rounds} done", file=sys.stderr, flush=True)
    finally:
        for process, jobs, _ in workers.values():
            jobs.put(None)
            process.join(timeout=30)
    print(f"\n{'threads':>7} {'quiet ms/step':>14} {'contended ms/step':>18} {'contended/quiet':>16}  threads used")
    for threads in args.threads:
        quiet, busy = (statistics.median(times[(threads, c)]) for c in (False, True))
        took = " / ".join(f"{statistics.mean(used[(threads, c)]):.2f}" for c in (False, True))
        print(f"{threads or 'auto':>7} {quiet:14.2f} {busy:18.2f} {busy / quiet:15.2f}x  {took}")
    how = "compiled" if args.compile else "eager"
    print(f"(--busy {args.busy} spinning process(es), {args.dtype}, {how}, {args.context} tokens of context)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
