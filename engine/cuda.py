"""CUDA-only engine settings: target/draft streams with priorities, and the per-process memory fraction.

Both are no-ops on a CPU (`Streams.target()` / `.draft()` become `nullcontext`), so the
decoding loop uses them unconditionally:

    with engine.streams.draft():
        draft = drafter.propose(...)        # low priority: yields the SMs to target work
    with engine.streams.target():
        logits = decoder.forward(...)       # high priority

Ordering (why this is safe). Entering a block makes its stream wait for everything already
queued on the caller's current stream (`stream.wait_stream(current)`): the inputs the caller
produced are ready. Leaving it makes the caller's stream wait for the block's stream, so the
caller (and the next block, on either stream) sees the outputs. Drafts also come back to the
loop as Python ints (`.tolist()` / `int(...)`), which synchronises the host with the draft
stream before the verify forward is built. These two joins also keep the caching allocator
safe: a block freed by one stream is only reused by work ordered after everything that read it.

What priorities buy: the block scheduler prefers the high-priority stream's kernels only
while kernels of both streams are queued at once. Blocks entered one after another from one
thread are ordered by the joins above and never overlap (the draft of a request must precede
its verify anyway); priorities act on work queued outside those joins: kernels issued on
`target_stream` / `draft_stream` directly (e.g. a draft pipelined behind another request's
verify), or other processes sharing the GPU under MPS. `bench/gpu_check.py` measures the effect.
A stream's priority cannot change once created, so `configure` takes fresh streams from
torch's pool (pool streams are never destroyed: cheap and safe while an old one has work queued).
"""

from __future__ import annotations

import math
import threading
from contextlib import contextmanager, nullcontext
from typing import Literal

import torch

Level = Literal["high", "low"]
LEVELS: tuple[str, ...] = ("high", "low")


class NoCudaStreams(RuntimeError):
    """Stream priorities were asked of a device that has none (a CPU)."""


class Streams:
    """The engine's target and draft CUDA streams; on a CPU every method is a no-op."""

    def __init__(self, device: torch.device | str, target: Level = "high", draft: Level = "low") -> None:
        self.device = torch.device(device)
        self.enabled = self.device.type == "cuda" and torch.cuda.is_available()
        self._lock = threading.Lock()
        self._target: torch.cuda.Stream | None = None
        self._draft: torch.cuda.Stream | None = None
        self.levels: dict[str, str] = {"target": target, "draft": draft}
        if self.enabled:
            self.configure(target, draft)

    def priority_range(self) -> tuple[int, int] | None:
        """(least, greatest) priority numbers, e.g. (0, -5): a lower number is a higher priority."""
        if not self.enabled:
            return None
        least, greatest = torch.cuda.Stream.priority_range()
        return int(least), int(greatest)

    def priority(self, level: str) -> int:
        """'high' -> the greatest priority (numerically lowest); 'low' -> the least (the default, 0)."""
        if level not in LEVELS:
            raise ValueError(f"stream priority must be one of {', '.join(LEVELS)}, got {level!r}")
        least, greatest = self.priority_range() or (0, 0)
        return greatest if level == "high" else least

    def configure(self, target: Level = "high", draft: Level = "low") -> dict:
        """New target/draft streams at these levels; returns {"before": ..., "after": ...} (describe())."""
        if not self.enabled:
            raise NoCudaStreams(f"device {self.device} has no CUDA streams; stream priorities apply only on CUDA")
        priorities = self.priority(target), self.priority(draft)  # validates both before changing anything
        with self._lock:
            before = self._describe()
            with torch.cuda.device(self.device):
                self._target = torch.cuda.Stream(self.device, priority=priorities[0])
                self._draft = torch.cuda.Stream(self.device, priority=priorities[1])
            self.levels = {"target": target, "draft": draft}
            return {"before": before, "after": self._describe()}

    def target(self):
        """Run the block on the target stream (CPU: nothing)."""
        return self._on(self._target) if self.enabled else nullcontext()

    def draft(self):
        """Run the block on the draft stream (CPU: nothing)."""
        return self._on(self._draft) if self.enabled else nullcontext()

    @property
    def target_stream(self) -> torch.cuda.Stream | None:
        return self._target

    @property
    def draft_stream(self) -> torch.cuda.Stream | None:
        return self._draft

    @contextmanager
    def _on(self, stream: torch.cuda.Stream):
        caller = torch.cuda.current_stream(self.device)
        stream.wait_stream(caller)  # inputs queued on the caller's stream are ready first
        try:
            with torch.cuda.stream(stream):
                yield stream
        finally:
            caller.wait_stream(stream)  # the caller (and the next block) sees this block's outputs

    def describe(self) -> dict:
        """For the control API and the `config` EngineEvent."""
        with self._lock:
            return self._describe()

    def _describe(self) -> dict:
        described = {
            "device": str(self.device),
            "enabled": self.enabled,
            "target": None,
            "draft": None,
            "target_priority": None,
            "draft_priority": None,
            "priority_range": None,
        }
        if not self.enabled:
            return {**described, "reason": f"device {self.device} has no CUDA streams"}
        least, greatest = self.priority_range()
        described["priority_range"] = [least, greatest]
        if self._target is not None and self._draft is not None:
            described.update(
                target=self.levels["target"],
                draft=self.levels["draft"],
                target_priority=self._target.priority,
                draft_priority=self._draft.priority,
            )
        return described


def check_memory_fraction(fraction: float) -> float:
    """The fraction as a float in (0, 1], else ValueError."""
    if (
        isinstance(fraction, bool)
        or not isinstance(fraction, (int, float))
        or not math.isfinite(fraction)
        or not 0 < fraction <= 1
    ):
        raise ValueError(f"memory fraction must be in (0, 1], got {fraction!r}")
    return float(fraction)


def apply_memory_fraction(device: torch.device | str, fraction: float) -> dict:
    """Cap this process's CUDA caching allocator at `fraction` of the device's memory.

    An allocation beyond the cap raises torch.OutOfMemoryError (which the scheduler retries
    in plain mode). On a CPU nothing is done, and the answer says so.
    """
    fraction = check_memory_fraction(fraction)
    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return {
            "device": str(device),
            "applied": False,
            "fraction": fraction,
            "reason": f"not applicable on {device.type}: the memory fraction caps the CUDA caching allocator",
        }
    index = device.index if device.index is not None else torch.cuda.current_device()
    before = torch.cuda.get_per_process_memory_fraction(index)
    torch.cuda.set_per_process_memory_fraction(fraction, index)
    total = torch.cuda.get_device_properties(index).total_memory
    return {
        "device": f"cuda:{index}",
        "applied": True,
        "fraction": fraction,
        "previous_fraction": before,
        "total_bytes": total,
        "limit_bytes": int(total * fraction),
    }
