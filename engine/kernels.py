"""The engine's own C++ kernel (`row_times.cpp`): one bf16 row times a bf16 weight matrix, the compiled
plain decode step's products, built once per machine by torch's extension builder for this CPU
(-march=native) and kept on disk beside Inductor's kernels; later starts load the built library.

Where the CPU has no bf16 dot product (AVX512-BF16), the kernel cannot be built (no C++ compiler, no
ninja) or it disagrees with torch on a check, the decode step keeps Inductor's reduction
(`engine.decoder._row_times`): `row_times_kernel()` says which, and why on stderr."""

from __future__ import annotations

import functools
import os
import sys
import time
from pathlib import Path

import torch

SOURCE = Path(__file__).with_name("row_times.cpp")
FLAGS = ["-O3", "-march=native", "-fopenmp"]


@functools.cache
def row_times_kernel() -> bool:
    """Whether `torch.ops.specwatch_cpu.row_times` is loaded and agrees with torch here (built on
    first use where the CPU has AVX512-BF16; SPECWATCH_ROW_KERNEL=0 keeps Inductor's reduction)."""
    if os.environ.get("SPECWATCH_ROW_KERNEL") == "0" or not torch.cpu._is_avx512_bf16_supported():
        return False  # without the CPU's bf16 dot product it was not measured faster than the reduction
    try:
        _build()
    except (RuntimeError, OSError, ImportError) as error:  # cpp_extension raises these for a failed build
        first_line = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
        print(f"engine: row-times kernel not built, the step keeps Inductor's products ({first_line})", file=sys.stderr)
        return False
    torch.library.register_fake("specwatch_cpu::row_times", _row_times_shape)
    return _agrees()


def _row_times_shape(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x.new_empty((1, weight.shape[0]))


def _build() -> None:
    from torch.utils import cpp_extension

    from engine.loading import default_cache_dir

    build = default_cache_dir() / "kernels"
    build.mkdir(parents=True, exist_ok=True)
    path = os.environ.get("PATH", "")
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{path}"  # the venv's ninja, venv not activated
    started = time.monotonic()
    try:
        cpp_extension.load(
            name="specwatch_row_times",
            sources=[str(SOURCE)],
            extra_cflags=FLAGS,
            build_directory=str(build),
            is_python_module=False,
            verbose=False,
        )
    finally:
        os.environ["PATH"] = path
    if (seconds := time.monotonic() - started) > 2:
        print(f"engine: row-times kernel built in {seconds:.0f} s ({build})", file=sys.stderr)


def _agrees() -> bool:
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
