"""Durations in rules files: '90s', '5m', '1h30m' or a number of seconds."""

from __future__ import annotations

import math
import re
from typing import Annotated

from pydantic import BeforeValidator

_DURATION = re.compile(r"^(?:(\d+(?:\.\d+)?)(ms|s|m|h|d))+$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: object) -> float:
    """'90s', '5m', '1h30m', '0s' or a number of seconds -> seconds."""
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, int | float):
        seconds = float(value)
    elif isinstance(value, str) and _DURATION.match(value.strip()):
        seconds = sum(float(n) * _UNIT_S[u] for n, u in re.findall(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)", value))
    else:
        raise ValueError(f"not a duration: {value!r} (use e.g. 30s, 5m, 1h)")
    if not math.isfinite(seconds) or seconds < 0:
        raise ValueError(f"duration must be finite and >= 0, got {value!r}")
    return seconds


def format_duration(seconds: float) -> str:
    """Seconds -> the shortest Prometheus duration ('300s' -> '5m')."""
    if seconds == 0:
        return "0s"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size and seconds % size == 0:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds * 1000)}ms"


Duration = Annotated[float, BeforeValidator(parse_duration)]
