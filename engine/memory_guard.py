"""Memory hot swap: unload the draft models when the device's memory use passes `high`, and
load the same drafts again once it falls below `low` (the gap is the hysteresis).

While the drafts are out, their requests decode plainly with `mode_reason="memory"` (the
policy's draft-loaded flag); n-gram drafting holds no weights and keeps running. Both moves
go through `engine.control` (so they are measured and emitted to the scheduler's telemetry as
`draft_unloaded` / `draft_loaded` events), with `"reason": "memory"` and the used fraction in the detail.
The guard only reloads what it unloaded itself: a manual unload stays manual.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from specwatch.engine import control
from specwatch.engine.device import Periodic

MEMINFO = Path("/proc/meminfo")


def used_fraction(device: torch.device) -> float | None:
    """Share of the device's memory in use: CUDA from the driver (all processes) or, when
    higher, this process's reserved bytes against its cap (set_per_process_memory_fraction:
    with a cap of 0.8 the driver's figure alone could never pass a 0.9 threshold);
    CPU from /proc/meminfo (1 - MemAvailable / MemTotal). None when it cannot be read."""
    if device.type == "cuda":
        free, total = torch.cuda.mem_get_info(device)
        cap = total * torch.cuda.get_per_process_memory_fraction(device)
        return max(1.0 - free / total, torch.cuda.memory_reserved(device) / cap if cap else 0.0)
    try:
        fields = dict(line.split(":", 1) for line in MEMINFO.read_text().splitlines() if ":" in line)
        total, available = (int(fields[k].split()[0]) for k in ("MemTotal", "MemAvailable"))
    except (OSError, KeyError, ValueError):
        return None
    return 1.0 - available / total if total else None


@dataclass(frozen=True)
class MemoryGuardConfig:
    high: float = 0.90  # unload the drafts above this used fraction
    low: float = 0.80  # ... and load them again below this one
    interval_s: float = 2.0

    def __post_init__(self) -> None:
        if not 0.0 < self.low < self.high <= 1.0:
            raise ValueError("memory guard needs 0 < low < high <= 1")


class MemoryGuard(Periodic):
    def __init__(
        self,
        scheduler,
        config: MemoryGuardConfig = MemoryGuardConfig(),
        read: Callable[[torch.device], float | None] = used_fraction,
    ) -> None:
        super().__init__(config.interval_s, "specwatch-memory-guard")
        self.scheduler, self.config, self.read = scheduler, config, read
        self.unloaded: list[str] | None = None  # what the guard took out, until it puts it back

    def check(self) -> str | None:
        """One reading; returns 'unloaded', 'reloaded' or None (nothing to do)."""
        used = self.read(self.scheduler.engine.target.device)
        if used is None:
            return None
        emit = self._emit_with({"reason": "memory", "used_fraction": used})
        if self.unloaded is None and used > self.config.high:
            self.unloaded = control.unload_drafts(self.scheduler, emit)["unloaded"]
            return "unloaded"
        if self.unloaded is not None and used < self.config.low:
            for spec in self.unloaded or [None]:
                control.load_drafts(self.scheduler, emit, spec)
            self.unloaded = None
            return "reloaded"
        return None

    def _emit_with(self, extra: dict):
        emit = self.scheduler.sink.emit
        return lambda kind, detail, duration_s: emit(kind, {**detail, **extra}, duration_s)

    def tick(self) -> None:
        self.check()
