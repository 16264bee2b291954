"""The engine's own C++ kernels, built once per machine by torch's extension builder for this CPU
(-march=native) into one library kept on disk beside Inductor's kernels; later starts load it:

- `row` (`row_times.cpp`): one bf16 row times a bf16 weight matrix, the compiled plain decode step's products;
- `prefill` (`prefill_attention.cpp`): causal attention over a whole bf16 prompt, the prompt forward's attention;
- `lane` (`lane_attention.cpp`): a batched round's attention, each sequence over its own lane of the
  slots' float32 cache pool.

They are built only where the CPU has the bf16 dot product (AVX512-BF16). Where it is missing, the library
cannot be built (no C++ compiler, no ninja), a kernel disagrees with torch on a check or SPECWATCH_CPU_KERNELS
leaves it out, the engine keeps torch's own path for it (Inductor's reduction, torch's attention kernel):
`row_times_kernel()`, `prefill_attention_kernel()` and `lane_attention_kernel()` say which, and why on stderr."""

from __future__ import annotations

import functools
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

# the attention kernels include vector_math.h beside them
SOURCES = [Path(__file__).with_name(f"{name}.cpp") for name in ("row_times", "prefill_attention", "lane_attention")]
KERNELS = ("row", "prefill", "lane")
FLAGS = ["-O3", "-march=native", "-fopenmp"]


@functools.cache
def row_times_kernel() -> bool:
    """Whether `torch.ops.specwatch_cpu.row_times` is loaded and agrees with torch here."""
    return _ready("row", "row_times", _row_times_shape, _row_times_agrees)


@functools.cache
def prefill_attention_kernel() -> bool:
    """Whether `torch.ops.specwatch_cpu.prefill_attention` is loaded and agrees with torch here."""
    return _ready("prefill", "prefill_attention", _same_shape_as_q, _prefill_attention_agrees)


@functools.cache
def lane_attention_kernel() -> bool:
    """Whether `torch.ops.specwatch_cpu.lane_attention` is loaded and agrees with torch here."""
    return _ready("lane", "lane_attention", _same_shape_as_q, _lane_attention_agrees)


def _ready(kernel: str, op: str, shape, agrees) -> bool:
    """`kernel` chosen, the library built, its op given a shape function for torch.compile, and checked."""
    if kernel not in chosen() or not _built():
        return False
    torch.library.register_fake(f"specwatch_cpu::{op}", shape)
    return agrees()


def chosen() -> frozenset[str]:
    """The kernels SPECWATCH_CPU_KERNELS leaves in (default: all; `none`, or a comma-separated subset of row,
    prefill, lane); ValueError for a name that is none of them (`EngineConfig` checks it at start)."""
    value = os.environ.get("SPECWATCH_CPU_KERNELS", ",".join(KERNELS)).replace(" ", "").lower()
    names = frozenset() if value == "none" else frozenset(filter(None, value.split(",")))
    if unknown := names - set(KERNELS):
        unknown_names = ", ".join(sorted(unknown))
        raise ValueError(f"SPECWATCH_CPU_KERNELS: unknown kernel(s) {unknown_names} (row, prefill, lane or none)")
    return names


def _row_times_shape(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x.new_empty((1, weight.shape[0]))


def _same_shape_as_q(q: torch.Tensor, *_) -> torch.Tensor:
    return q.new_empty(q.shape)


@functools.cache
def _built() -> bool:
    """Build (or load) the library, where the CPU has AVX512-BF16 (without the CPU's bf16 dot product
    neither kernel was measured faster than torch's path)."""
    if not torch.cpu._is_avx512_bf16_supported():
        return False
    try:
        _build()
    except (RuntimeError, OSError, ImportError) as error:  # cpp_extension raises these for a failed build
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        print(f"engine: C++ kernels not built, the engine keeps torch's own path ({first_line})", file=sys.stderr)
        return False
    return True


def _build() -> None:
    from torch.utils import cpp_extension

    from specwatch.engine.loading import default_cache_dir

    build = default_cache_dir() / "kernels"
    build.mkdir(parents=True, exist_ok=True)
    path = os.environ.get("PATH", "")
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{path}"  # the venv's ninja, venv not activated
    started = time.monotonic()
    try:
        cpp_extension.load(
            name="specwatch_cpu",
            sources=[str(source) for source in SOURCES],
            extra_cflags=FLAGS,
            build_directory=str(build),
            is_python_module=False,
            verbose=False,
        )
    finally:
        os.environ["PATH"] = path
    if (seconds := time.monotonic() - started) > 2:
        print(f"engine: C++ kernels built in {seconds:.0f} s ({build})", file=sys.stderr)


def _row_times_agrees() -> bool:
    """The kernel against torch's float32 product, on rows with and without a tail beyond a multiple of 32."""
    generator = torch.Generator().manual_seed(0)
    for out_features, in_features in ((37, 96), (64, 1000)):
        weight = torch.randn(out_features, in_features, generator=generator).bfloat16()
        x = torch.randn(1, in_features, generator=generator).bfloat16()
        want = (x.float() @ weight.float().t()).bfloat16()
        got = torch.ops.specwatch_cpu.row_times(x, weight)
        if got.shape != want.shape or not torch.allclose(got.float(), want.float(), rtol=2e-2, atol=2e-2):
            print("engine: row-times kernel disagrees with torch here; keeping Inductor's products", file=sys.stderr)
            return False
    return True


def _prefill_attention_agrees() -> bool:
    """The kernel against torch's float32 attention, for both head sizes it takes, over a block and a half of keys."""
    generator = torch.Generator().manual_seed(0)
    for heads, kv_heads, n, dim in ((6, 2, 97, 64), (4, 1, 70, 128)):
        q, k, v = (torch.randn(h, n, dim, generator=generator).bfloat16() for h in (heads, kv_heads, kv_heads))
        want = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), is_causal=True, enable_gqa=True)
        got = torch.ops.specwatch_cpu.prefill_attention(q, k, v, dim**-0.5)
        if got.shape != want.shape or not torch.allclose(got.float(), want, rtol=2e-2, atol=2e-2):
            print("engine: prefill-attention kernel disagrees with torch here; keeping torch's", file=sys.stderr)
            return False
    return True


def _lane_attention_agrees() -> bool:
    """The kernel against torch's float32 attention, sequence by sequence: sequences of 1 and of several rows,
    in lanes out of order."""
    generator = torch.Generator().manual_seed(0)
    for heads, kv_heads, dim in ((6, 2, 64), (4, 1, 128)):
        keys, values = (torch.randn(4, kv_heads, 40, dim, generator=generator) for _ in range(2))
        bounds = [(2, 17, 1), (0, 0, 5), (3, 30, 3)]
        q = torch.randn(9, heads, dim, generator=generator)
        got = torch.ops.specwatch_cpu.lane_attention(q, keys, values, torch.tensor(bounds))
        row = 0
        for lane, start, n in bounds:
            sees = torch.arange(start + n) <= torch.arange(start, start + n)[:, None]  # row i: keys 0 .. start + i
            k, v = keys[lane : lane + 1, :, : start + n], values[lane : lane + 1, :, : start + n]
            rows = q[row : row + n].transpose(0, 1).unsqueeze(0)
            want = F.scaled_dot_product_attention(rows, k, v, attn_mask=sees, enable_gqa=True)[0].transpose(0, 1)
            if not torch.allclose(got[row : row + n], want, rtol=1e-4, atol=1e-5):
                print("engine: lane-attention kernel disagrees with torch here; keeping torch's", file=sys.stderr)
                return False
            row += n
    return True
