"""The error every command line turns into one line and exit code 2, and the engine extra's check."""

import importlib.util


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


# what `pip install 'specwatch[engine]'` adds: the monitoring product (no extra) imports none of them
ENGINE_MODULES = ("torch", "transformers", "gguf", "accelerate", "safetensors")
ENGINE_EXTRA_HINT = "pip install 'specwatch[engine]'"


def missing_engine_module() -> str | None:
    """The first of the engine extra's modules this interpreter lacks, or None when the extra is installed."""
    return next((name for name in ENGINE_MODULES if importlib.util.find_spec(name) is None), None)


def require_engine(command: str) -> None:
    """Refuse a command that runs the bundled engine where the `[engine]` extra is absent."""
    if (missing := missing_engine_module()) is not None:
        raise UsageError(f"`specwatch {command}` runs the bundled engine, which needs {missing}: {ENGINE_EXTRA_HINT}")
