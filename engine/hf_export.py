"""`specwatch vllm prepare`: the bundled SmolLM2 GGUF as an HF directory vLLM can load.

vLLM reads HF directories, not this GGUF, so the weights come from `engine.loading`
(which dequantizes the GGUF once and caches float32 safetensors) and are laid out as:

    model.safetensors        the cached dequantized weights (hard-linked when possible, else copied)
    config.json              the cached config, plus the transformers-4 spellings of the same
                             values (`rope_theta`, `torch_dtype`) for older readers
    generation_config.json   as cached
    tokenizer.json, tokenizer_config.json (with `chat_template`), chat_template.jinja

The directory is written to a staging folder and renamed into place, so a failed
conversion never leaves a half-written model behind.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from pathlib import Path

DEFAULT_OUT = Path("data/vllm-model")
MODEL_FILES = ("model.safetensors", "config.json", "generation_config.json")


class PrepareError(Exception):
    """The conversion failed; the message names the path and the reason."""


def prepare(out: Path, source: str = "bundled") -> Path:
    """Write the HF directory for `source` (bundled | FILE.gguf | HF dir) to `out`; returns `out`."""
    from specwatch.engine.loading import ModelLoadError, load_model

    try:
        loaded = load_model(source, dtype="float32", device="cpu")
    except ModelLoadError as exc:
        raise PrepareError(str(exc)) from None
    out = out.expanduser().resolve()
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".staging-", dir=out.parent))
    except OSError as exc:
        raise PrepareError(f"{out}: cannot write here ({exc.strerror or exc})") from None
    try:
        _write(loaded.path, loaded.tokenizer, staging)
        if out.exists():
            shutil.rmtree(out)
        os.replace(staging, out)
    except OSError as exc:
        raise PrepareError(f"{out}: {exc.strerror or exc}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return out


def _write(cached: Path, tokenizer, out: Path) -> None:
    for name in MODEL_FILES:
        if (cached / name).is_file():
            _link_or_copy(cached / name, out / name)
    if not (out / "model.safetensors").is_file():
        raise PrepareError(f"{cached}: no model.safetensors in the dequantized copy")
    config = json.loads((out / "config.json").read_text())
    (out / "config.json").unlink()  # may be a hard link into the cache: never edit in place
    (out / "config.json").write_text(json.dumps(compatible_config(config), indent=2) + "\n")
    tokenizer.save_pretrained(out)
    template = tokenizer.chat_template
    if not template:
        raise PrepareError("the tokenizer has no chat template; vLLM's chat API needs one")
    tok_config = json.loads((out / "tokenizer_config.json").read_text())
    # vLLM may bundle transformers 4, which knows neither TokenizersBackend nor chat_template.jinja
    tok_config.update(chat_template=template, tokenizer_class="PreTrainedTokenizerFast")
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n")
    (out / "chat_template.jinja").write_text(template)


def compatible_config(config: dict) -> dict:
    """The config with both transformers 5 and 4 spellings of rope and dtype."""
    config = {**config, "quantization_config": None}
    config.pop("quantization_config")
    rope = config.get("rope_parameters") or {}
    if "rope_theta" in rope:
        config.setdefault("rope_theta", rope["rope_theta"])
        config.setdefault("rope_scaling", None if rope.get("rope_type", "default") == "default" else rope)
    if "dtype" in config:
        config.setdefault("torch_dtype", config["dtype"])
    return config


def _link_or_copy(source: Path, target: Path) -> None:
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def run_prepare(args) -> int:
    from specwatch.common.errors import UsageError

    try:
        out = prepare(args.out, args.model)
    except PrepareError as exc:
        raise UsageError(f"conversion failed: {exc}") from None
    print(out)
    return 0
