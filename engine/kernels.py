"""The engine's own C++ kernels, each its own library, built once by torch's extension builder for the CPU
features it needs (an explicit -m list, not -march=native) and kept on disk beside Inductor's kernels; later
starts load it without building:

- `row` (`row_times.cpp`): one bf16 row times a bf16 weight matrix, the compiled plain decode step's products;
  needs AVX512-BF16 (the bf16 dot product), with the AVX512BW, AVX512F and AVX2 beneath it;
- `prefill` (`prefill_attention.cpp`): causal attention over a whole bf16 prompt, the prompt forward's
  attention; needs AVX512-BF16 likewise;
- `lane` (`lane_attention.cpp`): a batched round's attention, each sequence over its own lane of the
  slots' float32 cache pool; float32 FMAs, needs AVX512F only;
- `rows` (`rows_times.cpp`): up to 8 bf16 rows times a bf16 weight matrix, widened to float32 FMAs, the eager
  forwards' products of a plain step or a verification; needs AVX512F only, and is used only where the CPU
  lacks AVX512-BF16 (where it has it, oneDNN's own bf16 kernels are kept).

`NEEDS` says which features (torch.cpu.get_capabilities() names) each needs; the first two were measured
faster than torch's path only with the bf16 dot product, and written for AVX512F alone they would widen bf16
to float32 as torch's path does. A CPU without AVX512-BF16 keeps `lane` and `rows`.

The cache: `<SPECWATCH_CACHE_DIR>/kernels/<kernel>-<key>/`, the key a hash of the kernel's source contents
(its .cpp and the headers it includes, copied into that folder and built from there, so that two checkouts
of identical sources share one build), its compiler flags, the CPU features it is built for, and the torch
and Python versions and machine type. `built_for.json` beside the library records those features (and the
rest of the key); a library is loaded only where this CPU has every one of them (as far as torch uses them:
ATEN_CPU_CAPABILITY lowers them), else it is refused with one line on stderr and never loaded.

Where a kernel's features are missing, its library cannot be built (no C++ compiler, no ninja), it
disagrees with torch on a check or SPECWATCH_CPU_KERNELS leaves it out, the engine keeps torch's own path
for it (Inductor's reduction, torch's attention kernel): `row_times_kernel()`, `prefill_attention_kernel()`
and `lane_attention_kernel()` say which, and why on stderr (silently where this CPU lacks the features and
nothing is cached)."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import platform
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

ENGINE_DIR = Path(__file__).resolve().parent
KERNELS = ("row", "prefill", "lane", "rows")
OPS = {"row": "row_times", "prefill": "prefill_attention", "lane": "lane_attention", "rows": "rows_times"}
# each kernel's files, beside this module: its source first, then the headers it includes
SOURCES = {
    "row": ("row_times.cpp",),
    "prefill": ("prefill_attention.cpp", "vector_math.h"),
    "lane": ("lane_attention.cpp", "vector_math.h"),
    "rows": ("rows_times.cpp",),
}
# the CPU features each kernel is built for (torch.cpu.get_capabilities() names), each enabled by its own flag
# and nothing else: what its intrinsics need and what the compiler's flags for them imply (-mavx512f: AVX2,
# and FMA3 and F16C with clang; AVX2 stands for the AVX, SSE4.2 and POPCNT below it, on every CPU with it)
AVX512 = ("avx2", "fma3", "f16c", "avx512_f")
NEEDS = {
    "row": (*AVX512, "avx512_bw", "avx512_bf16"),
    "prefill": (*AVX512, "avx512_bw", "avx512_bf16"),
    "lane": AVX512,
    "rows": AVX512,
}
FEATURE_FLAGS = {
    "avx2": "-mavx2",
    "fma3": "-mfma",
    "f16c": "-mf16c",
    "avx512_f": "-mavx512f",
    "avx512_bw": "-mavx512bw",
    "avx512_bf16": "-mavx512bf16",
}
BASE_FLAGS = ("-O3", "-fopenmp")
RECORD = "built_for.json"
# ATEN_CPU_CAPABILITY (torch's own dispatch) below AVX512 takes these features away
ABOVE = {"AVX2": ("avx512", "avx10", "amx"), "DEFAULT": ("avx", "fma", "f16c", "amx")}


@functools.cache
def row_times_kernel() -> bool:
    """Whether `torch.ops.specwatch_cpu.row_times` is loaded and agrees with torch here."""
    return _ready("row", _row_times_shape, _row_times_agrees)


@functools.cache
def prefill_attention_kernel() -> bool:
    """Whether `torch.ops.specwatch_cpu.prefill_attention` is loaded and agrees with torch here."""
    return _ready("prefill", _same_shape_as_q, _prefill_attention_agrees)


@functools.cache
def lane_attention_kernel() -> bool:
    """Whether `torch.ops.specwatch_cpu.lane_attention` is loaded and agrees with torch here."""
    return _ready("lane", _same_shape_as_q, _lane_attention_agrees)


@functools.cache
def rows_times_kernel() -> bool:
    """Whether `torch.ops.specwatch_cpu.rows_times` is loaded and agrees with torch here."""
    return _ready("rows", _rows_times_shape, _rows_times_agrees)


def why_not(kernel: str) -> str:
    """Why `kernel` is not in use here, in words (for a test's skip reason or a log line)."""
    if missing := [feature for feature in NEEDS[kernel] if feature not in host_features()]:
        return f"this CPU lacks {', '.join(missing)}"
    if kernel not in chosen():
        return "SPECWATCH_CPU_KERNELS leaves it out"
    return "its library could not be built, loaded or checked here (see stderr: C++ compiler, ninja)"


def _ready(kernel: str, shape, agrees) -> bool:
    """`kernel` chosen, its library built and loaded, its op given a shape function for torch.compile, and checked."""
    if kernel not in chosen() or not load(kernel):
        return False
    torch.library.register_fake(f"specwatch_cpu::{OPS[kernel]}", shape)
    return agrees()


def chosen() -> frozenset[str]:
    """The kernels SPECWATCH_CPU_KERNELS leaves in (default: all; `none`, or a comma-separated subset of row,
    prefill, lane, rows); ValueError for a name that is none of them (`EngineConfig` checks it at start)."""
    value = os.environ.get("SPECWATCH_CPU_KERNELS", ",".join(KERNELS)).replace(" ", "").lower()
    names = frozenset() if value == "none" else frozenset(filter(None, value.split(",")))
    if unknown := names - set(KERNELS):
        unknown_names = ", ".join(sorted(unknown))
        raise ValueError(f"SPECWATCH_CPU_KERNELS: unknown kernel(s) {unknown_names} (row, prefill, lane, rows or none)")
    return names


def _row_times_shape(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x.new_empty((1, weight.shape[0]))


def _rows_times_shape(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return x.new_empty((x.shape[0], weight.shape[0]))


def _same_shape_as_q(q: torch.Tensor, *_) -> torch.Tensor:
    return q.new_empty(q.shape)


def host_features() -> frozenset[str]:
    """The CPU features of this host that torch reports (torch.cpu.get_capabilities(): cpuinfo, which counts
    only what the OS enables too), less those above the capability torch dispatches to (ATEN_CPU_CAPABILITY)."""
    capabilities = getattr(torch.cpu, "get_capabilities", dict)()
    features = {name for name, value in capabilities.items() if value is True}
    above = ABOVE.get(torch.backends.cpu.get_cpu_capability(), ())
    return frozenset(name for name in features if not name.startswith(above))


def flags(kernel: str) -> list[str]:
    """The compiler flags `kernel` is built with: its features enabled one by one, nothing of the host's."""
    return [*BASE_FLAGS, *(FEATURE_FLAGS[feature] for feature in NEEDS[kernel])]


def build_record(kernel: str, root: Path = ENGINE_DIR) -> dict:
    """What `kernel`'s build depends on, paths left out: its sources' contents (from `root`), flags, the
    features it is built for, torch, Python and the machine type. Its hash is the cache key."""
    return {
        "kernel": kernel,
        "sources": {name: hashlib.sha256((root / name).read_bytes()).hexdigest() for name in SOURCES[kernel]},
        "flags": flags(kernel),
        "features": sorted(NEEDS[kernel]),
        "torch": torch.__version__,
        "python": f"{sys.version_info.major}.{sys.version_info.minor}",
        "machine": platform.machine(),
    }


def cache_key(kernel: str, root: Path = ENGINE_DIR) -> str:
    """`kernel`'s cache key: the hash of `build_record` (the same from any checkout of the same sources)."""
    record = json.dumps(build_record(kernel, root), sort_keys=True).encode()
    return hashlib.sha256(record).hexdigest()[:20]


def library_dir(kernel: str, root: Path = ENGINE_DIR) -> Path:
    """The folder `kernel`'s library is built and kept in: its copied sources, the library, `RECORD`."""
    from specwatch.engine.loading import default_cache_dir

    return default_cache_dir() / "kernels" / f"{kernel}-{cache_key(kernel, root)}"


def library_file(kernel: str, directory: Path) -> Path:
    return directory / f"specwatch_{OPS[kernel]}.so"


def recorded_features(kernel: str, directory: Path) -> frozenset[str] | None:
    """The features the library in `directory` was recorded as built for; None where there is no library,
    or no readable record of this kernel's key beside it (not built, or its build not finished)."""
    try:
        record = json.loads((directory / RECORD).read_text())
        if not library_file(kernel, directory).is_file() or f"{kernel}-{record['key']}" != directory.name:
            return None
        return frozenset(record["features"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def load(kernel: str) -> bool:
    """Load `kernel`'s library from the cache, building it first where the cache lacks it and this CPU has
    the features it needs. A cached library recorded for features this CPU lacks is refused, not loaded."""
    host = host_features()
    try:
        directory = library_dir(kernel)
    except OSError as error:  # a source unreadable
        return _keeps_torch(kernel, "not built", error)
    recorded = recorded_features(kernel, directory)
    if recorded is None:
        if not set(NEEDS[kernel]) <= host:
            return False
        try:
            build(kernel)
        except (RuntimeError, OSError, ImportError) as error:  # cpp_extension raises these for a failed build
            return _keeps_torch(kernel, "not built", error)
        recorded = recorded_features(kernel, directory) or frozenset(NEEDS[kernel])
    if missing := (recorded | set(NEEDS[kernel])) - host:
        lacks = ", ".join(sorted(missing))
        return _keeps_torch(kernel, f"refused: its cached library ({directory}) needs {lacks}, which this CPU lacks")
    try:
        torch.ops.load_library(str(library_file(kernel, directory)))
    except (OSError, RuntimeError) as error:
        return _keeps_torch(kernel, "not loaded", error)
    return True


def _keeps_torch(kernel: str, why: str, error: BaseException | None = None) -> bool:
    """False, after one line on stderr: why `kernel` is not used (the first line of `error`, if any)."""
    detail = f" ({(str(error).strip().splitlines() or [type(error).__name__])[0][:200]})" if error else ""
    print(f"engine: C++ kernel {kernel} {why}; the engine keeps torch's own path{detail}", file=sys.stderr)
    return False


def build(kernel: str, root: Path = ENGINE_DIR) -> Path:
    """`kernel`'s library folder for the sources in `root`, built there first where it holds no finished
    build: the sources copied in (the builder records their paths), compiled, then `RECORD` written."""
    directory = library_dir(kernel, root)
    if recorded_features(kernel, directory) is not None:
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    for name in SOURCES[kernel]:
        _copy_if_changed(root / name, directory / name)
    started = time.monotonic()
    _compile(kernel, directory)
    record = {"key": cache_key(kernel, root), **build_record(kernel, root)}
    _write_atomically(directory / RECORD, json.dumps(record, indent=1, sort_keys=True).encode())
    if (seconds := time.monotonic() - started) > 2:
        print(f"engine: C++ kernel {kernel} built in {seconds:.0f} s ({directory})", file=sys.stderr)
    return directory


def _compile(kernel: str, directory: Path) -> None:
    """Build `directory`'s copy of `kernel`'s source into `library_file` by torch's extension builder (which
    loads it too: built only for features this CPU has), one builder at a time (its lock in `directory`)."""
    from torch.utils import cpp_extension

    path = os.environ.get("PATH", "")
    os.environ["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{path}"  # the venv's ninja, venv not activated
    try:
        cpp_extension.load(
            name=library_file(kernel, directory).stem,
            sources=[str(directory / SOURCES[kernel][0])],
            extra_cflags=flags(kernel),
            build_directory=str(directory),
            is_python_module=False,
            verbose=False,
        )
    finally:
        os.environ["PATH"] = path


def _copy_if_changed(source: Path, target: Path) -> None:
    """Copy `source` to `target` unless it already holds the same bytes (its time left alone: no rebuild)."""
    content = source.read_bytes()
    if not target.is_file() or target.read_bytes() != content:
        _write_atomically(target, content)


def _write_atomically(target: Path, content: bytes) -> None:
    partial = target.with_name(f".{target.name}.{os.getpid()}")
    partial.write_bytes(content)
    os.replace(partial, target)


def _row_times_agrees() -> bool:
    """The kernel against torch's float32 product, on rows with and without a tail beyond a multiple of 32."""
    cases = ((1, 37, 96), (1, 64, 1000))
    return _product_agrees(torch.ops.specwatch_cpu.row_times, cases, "row-times", "Inductor's")


def _rows_times_agrees() -> bool:
    """The kernel against torch's float32 product for 1 to 8 rows, with and without a tail beyond 32 columns."""
    cases = ((1, 37, 96), (3, 64, 1000), (8, 20, 576))
    return _product_agrees(torch.ops.specwatch_cpu.rows_times, cases, "rows-times", "oneDNN's")


def _product_agrees(op, cases: tuple[tuple[int, int, int], ...], kernel: str, fallback: str) -> bool:
    """`op`(x [rows, in], weight [out, in]) against torch's float32 product rounded to bf16, for each
    (rows, out, in) of `cases`; one stderr line where it disagrees."""
    generator = torch.Generator().manual_seed(0)
    for rows, out_features, in_features in cases:
        weight = torch.randn(out_features, in_features, generator=generator).bfloat16()
        x = torch.randn(rows, in_features, generator=generator).bfloat16()
        want = (x.float() @ weight.float().t()).bfloat16()
        got = op(x, weight)
        if got.shape != want.shape or not torch.allclose(got.float(), want.float(), rtol=2e-2, atol=2e-2):
            print(f"engine: {kernel} kernel disagrees with torch here; keeping {fallback} products", file=sys.stderr)
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
