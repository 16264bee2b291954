"""Actions on a running engine (the control API; alerts call them): defragment memory,
unload or load the draft models, set the CUDA stream priorities of target and draft. Each returns
what it did, measured before and after, and emits an EngineEvent through
`emit(kind, detail, duration_s)` (a TelemetrySink's `emit`).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import os
import time
from dataclasses import asdict

import torch

from specwatch.engine.device import cpu_heap_memory, cuda_memory
from specwatch.engine.suffix import MODEL_FREE

_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int:
    """Resident set size of this process (Linux /proc)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except OSError:
        return 0


def _memory(device: torch.device) -> dict:
    memory = cuda_memory(device) if device.type == "cuda" else cpu_heap_memory()
    reading = asdict(memory) if memory else {}
    if memory:
        reading["fragmentation"] = memory.fragmentation
    return {**reading, "rss_bytes": rss_bytes()}


def _malloc_trim() -> bool:
    try:
        return bool(ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0))
    except (OSError, AttributeError):
        return False


def defragment(scheduler, emit) -> dict:
    """CUDA: release cached blocks (empty_cache); CPU: return free heap pages to the OS (malloc_trim)."""
    device = scheduler.engine.target.device
    started, before = time.monotonic(), _memory(device)
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        action = "torch.cuda.empty_cache"
    else:
        action = "malloc_trim" if _malloc_trim() else "malloc_trim (nothing released)"
    report = {"action": action, "before": before, "after": _memory(device), "duration_s": time.monotonic() - started}
    emit("defrag", report, report["duration_s"])
    return report


def unload_drafts(scheduler, emit) -> dict:
    """Drop every draft model and early-exit cache; speculation with them pauses ('memory')."""
    engine = scheduler.engine
    started, before = time.monotonic(), _memory(engine.target.device)
    unloaded = sorted(
        {spec for slot in scheduler.slots for spec in slot.drafters if spec not in MODEL_FREE}
        | set(engine._draft_models)
    )
    scheduler.policy.set_draft_loaded(False)
    for slot in scheduler.slots:
        for spec in [s for s in slot.drafters if s not in MODEL_FREE]:
            del slot.drafters[spec]
    engine._draft_models.clear()
    gc.collect()
    if engine.target.device.type == "cuda":
        torch.cuda.empty_cache()
    else:
        _malloc_trim()
    after = _memory(engine.target.device)
    report = {
        "unloaded": unloaded,
        "before": before,
        "after": after,
        "freed_rss_bytes": before["rss_bytes"] - after["rss_bytes"],
        "duration_s": time.monotonic() - started,
    }
    emit("draft_unloaded", report, report["duration_s"])
    return report


def load_drafts(scheduler, emit, spec: str | None) -> dict:
    """Allow draft models again; with `spec`, load it now rather than on first use."""
    engine = scheduler.engine
    started, before = time.monotonic(), _memory(engine.target.device)
    if spec:
        engine.check_drafter(spec)
        engine.drafter(spec, scheduler.slots[0])
    scheduler.policy.set_draft_loaded(True)
    after = _memory(engine.target.device)
    report = {"loaded": spec, "before": before, "after": after, "duration_s": time.monotonic() - started}
    emit("draft_loaded", report, report["duration_s"])
    return report


def set_streams(scheduler, emit, target: str, draft: str) -> dict:
    """CUDA: fresh target/draft streams at these priority levels ('high' | 'low').

    Raises engine.cuda.NoCudaStreams on a CPU (nothing is changed, nothing emitted)."""
    started = time.monotonic()
    change = scheduler.engine.streams.configure(target, draft)
    report = {"action": "streams", **change, "duration_s": time.monotonic() - started}
    emit("streams", report, report["duration_s"])
    return report


def set_mode(scheduler, emit, mode: str, reason: str, identity: dict, drafter_changed: bool = False) -> dict:
    """Override the policy's mode ('auto' lifts it). A manual change, or a new default drafter, emits a
    `config` deploy marker carrying the serving identity (`engine.markers.identity`: version, model hash,
    default drafter) and the mode now in force; an alert's fallback is remediation, not a deploy (a marker
    there would supersede the one the regression alert compares around)."""
    scheduler.policy.set_override(mode, reason)
    detail = {**identity, "mode": mode, "mode_reason": reason}
    if reason == "manual" or drafter_changed:
        emit("config", detail, 0.0)
    return detail
