"""The engine's rows-times kernel against oneDNN's packed bf16 product: the bundled model's eager forward of
n rows after a prompt (n = 1: a plain step; k + 1: a verification of k drafted tokens), both ways in one run.

    python bench/rows_kernel.py [--rows 1 2 3 4 5 8] [--context 200] [--repeats 20] [--threads 1]

Each forward runs with every weight's few-row products by the kernel (`engine/rows_times.cpp`) and then by
oneDNN's packed kernel, alternately, `--repeats` times each after two warm-ups; the cache is cropped back to
the prompt after each. Printed per n: median ms a forward both ways, their ratio, and each way's cost of n
rows relative to its own single row (what a verification costs against a plain step: engine/lookahead.py).
The engine uses the kernel only on a CPU without AVX512-BF16 (engine/decoder.py `few_rows_kernel`); elsewhere
this measures what it would do.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def forward_ms(decoder, tokens, context: int, few_rows: bool, matrices) -> float:
    for matrix in matrices:
        matrix.few_rows = few_rows
    started = time.perf_counter()
    decoder.forward(tokens)
    seconds = time.perf_counter() - started
    decoder.crop(context)
    return seconds * 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 3, 4, 5, 8])
    parser.add_argument("--context", type=int, default=200, help="prompt tokens before the timed forwards")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    if not all(1 <= n <= 8 for n in args.rows) or args.context < 1 or args.repeats < 1 or args.threads < 1:
        parser.error("--rows must be within 1..8 (the kernel's most), --context, --repeats and --threads positive")
    import torch

    from specwatch.engine.decoder import few_rows_kernel, make_decoder
    from specwatch.engine.kernels import host_features, rows_times_kernel, why_not
    from specwatch.engine.loading import load_model

    if not rows_times_kernel():
        print(f"rows_kernel: the rows-times kernel is not built here: {why_not('rows')}", file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    model = load_model("bundled", "bfloat16")
    decoder = make_decoder(model.model)
    matrices = [m for layer in decoder.layers for m in (layer.wqkv, layer.wo, layer.w_gate_up, layer.w_down)]
    matrices.append(decoder.lm_head)
    decoder.reset(args.context + 16)
    decoder.forward(torch.arange(args.context) % 1000 + 100)
    bf16 = "avx512_bf16" in host_features()
    print(f"bf16, {args.threads} thread(s), {args.context} tokens of context; this CPU "
          f"{'has' if bf16 else 'lacks'} AVX512-BF16: the engine {'uses' if few_rows_kernel() else 'does not use'} "
          "the kernel here")  # fmt: skip
    columns = ("kernel ms", "oneDNN ms", "oneDNN/kernel", "kernel x1", "oneDNN x1")
    print(f"{'rows':>4s} " + " ".join(f"{name:>{max(10, len(name) + 1)}s}" for name in columns))
    single = {}
    for n in args.rows:
        tokens = torch.arange(n) + 500
        times = {True: [], False: []}
        for repeat in range(args.repeats + 2):
            for few_rows in (True, False):
                ms = forward_ms(decoder, tokens, args.context, few_rows, matrices)
                if repeat >= 2:
                    times[few_rows].append(ms)
        kernel, onednn = statistics.median(times[True]), statistics.median(times[False])
        single.setdefault("k", kernel), single.setdefault("o", onednn)
        print(f"{n:4d} {kernel:10.1f} {onednn:10.1f} {onednn / kernel:13.2f}x {kernel / single['k']:9.2f}x "
              f"{onednn / single['o']:9.2f}x")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
