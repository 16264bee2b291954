"""Deploy markers: what a `config` engine event says about the serving configuration, so the collector's
regression detector (alerts.regression) can name what changed at a marker.

The identity is specwatch's version (importlib.metadata), a model hash and the drafters: the default
one (what a request naming none gets) and those registered with `--drafters`. The model hash is cheap
and reads no weights: sha256 over the model directory's weight and config files' names, sizes and
mtimes (nanoseconds), so a new checkpoint, a re-quantised copy or a swapped file changes it, while a
restart on the same files keeps it. The engine emits it at start (`engine.cli`) and whenever the
control API changes the mode or the default drafter (`engine.control.set_mode`).
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

HASHED = ("*.safetensors", "*.bin", "*.pt", "*.gguf", "config.json", "generation_config.json")


def specwatch_version() -> str:
    try:
        return version("specwatch")
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


def model_hash(path: Path) -> str:
    """sha256 (16 hex digits) of the model files' names, sizes and mtimes; of the path alone when absent."""
    path = Path(path)
    files = sorted({f for pattern in HASHED for f in path.glob(pattern)}) if path.is_dir() else [path]
    digest = hashlib.sha256(str(path.name).encode())
    for f in (f for f in files if f.is_file()):
        stat = f.stat()
        digest.update(f"\0{f.name}:{stat.st_size}:{stat.st_mtime_ns}".encode())
    return digest.hexdigest()[:16]


def identity(engine, default_drafter: str | None, drafters: Mapping[str, str]) -> dict:
    """The marker's identity fields: version, model, model hash, drafter (the default's spec, as request
    records name it), the default's name and the registered drafters (name -> spec)."""
    default_spec = None if default_drafter in (None, "none") else drafters.get(default_drafter, default_drafter)
    return {
        "version": specwatch_version(),
        "model": engine.target.name,
        "model_hash": model_hash(engine.target.path),
        "drafter": default_spec or "none",
        "default_drafter": default_drafter or "none",
        "drafters": dict(sorted(drafters.items())),
    }
