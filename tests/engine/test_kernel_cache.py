"""Where the engine's C++ kernels are kept (engine/kernels.py) and when a kept one is loaded: one library a
kernel, keyed by its sources' contents, flags, the CPU features it is built for and torch's version (not by
the checkout's path), and refused, never loaded, where this CPU lacks a feature its record names.

Nothing here compiles: the builder is replaced by one that counts, and the real libraries are those the
other kernel tests build (once a machine, reused from the cache)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from specwatch.engine import kernels
from specwatch.engine.kernels import KERNELS, NEEDS, SOURCES


def checkout(root: Path) -> Path:
    """A copy of the kernels' sources, as a second checkout of the repository would hold them."""
    engine = root / "engine"
    engine.mkdir(parents=True)
    for name in {name for names in SOURCES.values() for name in names}:
        shutil.copy2(kernels.ENGINE_DIR / name, engine / name)
    return engine


def cache_entry(kernel: str, features: list[str]) -> Path:
    """A finished cache entry for `kernel` under SPECWATCH_CACHE_DIR, recorded as built for `features`; its
    library is not one (loading it would fail with an error, not go unnoticed)."""
    directory = kernels.library_dir(kernel)
    directory.mkdir(parents=True)
    kernels.library_file(kernel, directory).write_bytes(b"not a library: it is never loaded")
    record = {"key": kernels.cache_key(kernel), **kernels.build_record(kernel), "features": features}
    (directory / kernels.RECORD).write_text(json.dumps(record))
    return directory


@pytest.fixture
def builds(tmp_path, monkeypatch) -> list[str]:
    """The kernels built, in order, into an empty cache folder (tmp_path/cache) by a builder that writes a
    stand-in library."""
    monkeypatch.setenv("SPECWATCH_CACHE_DIR", str(tmp_path / "cache"))
    built = []

    def fake_compile(kernel: str, directory: Path) -> None:
        built.append(kernel)
        kernels.library_file(kernel, directory).write_bytes(b"built")

    monkeypatch.setattr(kernels, "_compile", fake_compile)
    return built


def test_two_checkouts_of_the_same_sources_have_one_key(tmp_path):
    first, second = checkout(tmp_path / "a" / "main"), checkout(tmp_path / "b" / "deeper" / "main")
    for kernel in KERNELS:
        assert kernels.cache_key(kernel, first) == kernels.cache_key(kernel, second) == kernels.cache_key(kernel)
        assert str(tmp_path) not in json.dumps(kernels.build_record(kernel, first))


def test_the_key_follows_the_sources_contents_flags_features_and_torch(tmp_path, monkeypatch):
    engine = checkout(tmp_path)
    before = {kernel: kernels.cache_key(kernel, engine) for kernel in KERNELS}
    with (engine / "vector_math.h").open("a") as header:
        header.write("\n")
    after = {kernel: kernels.cache_key(kernel, engine) for kernel in KERNELS}
    assert after["row"] == before["row"]  # it does not include the attention kernels' header
    assert after["prefill"] != before["prefill"] and after["lane"] != before["lane"]
    monkeypatch.setitem(NEEDS, "row", NEEDS["lane"])
    assert kernels.cache_key("row", engine) != before["row"]
    monkeypatch.setattr(kernels, "BASE_FLAGS", ("-O2", "-fopenmp"))
    assert kernels.cache_key("lane", engine) != after["lane"]
    monkeypatch.setattr(torch, "__version__", "0.0.1")
    assert kernels.cache_key("prefill", engine) != after["prefill"]


def test_a_second_checkout_loads_what_the_first_built(tmp_path, builds):
    first, second = checkout(tmp_path / "a" / "main"), checkout(tmp_path / "b" / "main")
    for kernel in KERNELS:
        built = kernels.build(kernel, first)
        assert kernels.build(kernel, second) == built == kernels.library_dir(kernel)
        assert built.parent == tmp_path / "cache" / "kernels"
        for name in SOURCES[kernel]:  # built from copies beside it, not from either checkout
            assert (built / name).read_bytes() == (first / name).read_bytes()
        record = json.loads((built / kernels.RECORD).read_text())
        assert record["features"] == sorted(NEEDS[kernel]) and record["flags"] == kernels.flags(kernel)
    assert builds == list(KERNELS)  # once each, for both checkouts


def test_an_unfinished_build_is_built_again(builds):
    """A library without its record (a build cut short) is not taken: the next start builds it again."""
    directory = kernels.build("lane")
    (directory / kernels.RECORD).unlink()
    assert kernels.recorded_features("lane", directory) is None
    assert kernels.build("lane") == directory and builds == ["lane", "lane"]


@pytest.mark.parametrize(
    ("kernel", "recorded", "host", "lacks"),
    [
        ("row", list(NEEDS["row"]), set(NEEDS["lane"]), "avx512_bf16, avx512_bw"),  # an AVX512F CPU
        ("prefill", list(NEEDS["prefill"]), {"avx2", "fma3", "f16c"}, "avx512_bf16, avx512_bw, avx512_f"),
        ("lane", [*NEEDS["lane"], "amx_tile"], set(NEEDS["row"]), "amx_tile"),  # its record, not only NEEDS
    ],
)
def test_a_cached_library_built_for_features_this_cpu_lacks_is_refused_not_loaded(
    kernel, recorded, host, lacks, builds, monkeypatch, capsys
):
    directory = cache_entry(kernel, recorded)
    monkeypatch.setattr(kernels, "host_features", lambda: frozenset(host))
    loads = []
    monkeypatch.setattr(torch.ops, "load_library", loads.append)
    assert kernels.load(kernel) is False
    assert loads == [] and builds == []
    assert capsys.readouterr().err.splitlines() == [
        f"engine: C++ kernel {kernel} refused: its cached library ({directory}) needs {lacks}, which this CPU "
        "lacks; the engine keeps torch's own path"
    ]


def test_a_cpu_lacking_the_features_with_nothing_cached_builds_nothing_and_says_nothing(builds, monkeypatch, capsys):
    monkeypatch.setattr(kernels, "host_features", lambda: frozenset(NEEDS["lane"]))
    monkeypatch.setattr(torch.ops, "load_library", lambda path: None)
    assert kernels.load("row") is False and kernels.load("prefill") is False
    assert kernels.load("lane") is True  # what needs AVX512F only is built and kept
    assert builds == ["lane"] and capsys.readouterr().err == ""


def test_torchs_dispatch_capability_lowers_the_features(monkeypatch):
    capabilities = {"avx2": True, "fma3": True, "f16c": True, "avx512_f": True, "avx512_bf16": True, "cpu_name": "x"}
    monkeypatch.setattr(torch.cpu, "get_capabilities", lambda: capabilities)
    for capability, features in [
        ("AVX512", {"avx2", "fma3", "f16c", "avx512_f", "avx512_bf16"}),
        ("AVX2", {"avx2", "fma3", "f16c"}),
        ("DEFAULT", set()),
    ]:
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda capability=capability: capability)
        assert kernels.host_features() == features


ISA_MACRO = re.compile(r"__(AVX|SSE|FMA|F16C|POPCNT|XSAVE|CRC32|BMI|LZCNT|AMX|VNNI|VPCLMUL|GFNI|VAES|PCLMUL)\w*__")
MACROS = {
    "avx2": "__AVX2__",
    "fma3": "__FMA__",
    "f16c": "__F16C__",
    "avx512_f": "__AVX512F__",
    "avx512_bw": "__AVX512BW__",
    "avx512_bf16": "__AVX512BF16__",
}
# below AVX2 on every CPU that has it
WITH_AVX2 = {"__AVX__", "__SSE3__", "__SSSE3__", "__SSE4_1__", "__SSE4_2__", "__POPCNT__", "__XSAVE__", "__CRC32__"}


def isa_macros(flags: list[str]) -> set[str]:
    compiler = os.environ.get("CXX", "c++")
    listing = subprocess.run([compiler, *flags, "-dM", "-E", "-x", "c++", os.devnull], capture_output=True, text=True)
    return {name for name in re.findall(r"#define (\S+)", listing.stdout) if ISA_MACRO.fullmatch(name)}


@pytest.mark.skipif(shutil.which(os.environ.get("CXX", "c++")) is None, reason="no C++ compiler here")
@pytest.mark.parametrize("kernel", KERNELS)
def test_a_kernels_flags_enable_no_instructions_beyond_the_features_it_records(kernel):
    """The compiler's own view of the flags: every instruction set they enable is one the record names (or
    one below AVX2), so that a CPU with the recorded features runs everything the library holds."""
    enabled = isa_macros(kernels.flags(kernel)) - isa_macros([])
    assert {MACROS[feature] for feature in NEEDS[kernel]} <= enabled <= {MACROS[f] for f in NEEDS[kernel]} | WITH_AVX2


def test_the_real_libraries_are_shared_by_another_checkout(tmp_path, monkeypatch):
    """The libraries this machine built (the other kernel tests use them) are what a second checkout of the
    same sources loads: same folder, no build; their build files name the copies beside them."""
    loaded = {"row": kernels.row_times_kernel(), "prefill": kernels.prefill_attention_kernel()}
    loaded |= {"lane": kernels.lane_attention_kernel(), "rows": kernels.rows_times_kernel()}
    if not any(loaded.values()):
        pytest.skip("no kernel of the engine's is built here (CPU features, C++ compiler or ninja)")
    second = checkout(tmp_path / "other" / "main")

    def no_build(kernel, directory):
        raise AssertionError(f"{kernel} built again in {directory}")

    monkeypatch.setattr(kernels, "_compile", no_build)
    for kernel in (kernel for kernel, is_loaded in loaded.items() if is_loaded):
        directory = kernels.build(kernel, second)
        assert directory == kernels.library_dir(kernel) and kernels.load(kernel)
        ninja = (directory / "build.ninja").read_text()
        source = SOURCES[kernel][0]
        assert str(directory / source) in ninja and str(kernels.ENGINE_DIR / source) not in ninja
        assert "-march=native" not in ninja


def test_the_engine_keeps_torchs_path_where_every_cached_library_is_refused(tmp_path, monkeypatch):
    """A fresh engine process on a CPU below the cached libraries' features (torch's capability lowered to
    DEFAULT: no AVX at all): one stderr line a kernel, nothing loaded or built, the decoder runs by torch."""
    monkeypatch.setenv("SPECWATCH_CACHE_DIR", str(tmp_path / "cache"))
    entries = {kernel: cache_entry(kernel, list(NEEDS[kernel])) for kernel in KERNELS}
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "default"}
    env.pop("SPECWATCH_CPU_KERNELS", None)
    script = textwrap.dedent(
        """
        import json, torch
        from specwatch.engine import kernels
        from transformers import LlamaConfig, LlamaForCausalLM
        from specwatch.engine.decoder import LlamaDecoder

        used = [kernels.row_times_kernel(), kernels.prefill_attention_kernel(), kernels.lane_attention_kernel()]
        used.append(kernels.rows_times_kernel())
        torch.manual_seed(3)
        shape = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2)
        config = LlamaConfig(vocab_size=256, num_hidden_layers=2, tie_word_embeddings=False, **shape)
        decoder = LlamaDecoder(LlamaForCausalLM(config).eval().to(torch.bfloat16))
        decoder.reset(80)
        logits = decoder.forward(torch.arange(70) % 256, keep=1)
        logits = decoder.forward(torch.tensor([int(logits[-1].argmax())]))
        print(json.dumps({"used": used, "prefill": decoder.prefill_kernel, "finite": bool(logits.isfinite().all())}))
        """
    )
    run = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert json.loads(run.stdout.splitlines()[-1]) == {"used": [False] * 4, "prefill": False, "finite": True}
    lines = [line for line in run.stderr.splitlines() if line.startswith("engine:")]
    assert len(lines) == len(KERNELS), run.stderr[-3000:]
    for kernel, line in zip(KERNELS, lines):
        assert line.startswith(f"engine: C++ kernel {kernel} refused: its cached library ({entries[kernel]}) needs ")
        assert not list(entries[kernel].glob("*.o"))  # nothing built over it
