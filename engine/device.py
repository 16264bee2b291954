"""Periodic device samples: memory and its fragmentation, power, utilisation, load.

Memory: on CUDA from `torch.cuda.memory_stats` (fragmentation = reserved / allocated);
on CPU from glibc's `mallinfo2` (fragmentation = (arena + mmap) / in-use bytes).
Power: NVML on CUDA when `nvidia-ml-py` is installed, Intel RAPL on CPU when
/sys/class/powercap is readable; otherwise, on CPU, an estimate from this process's
CPU time, always labelled `power_source: estimate` (never passed off as measured).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from specwatch.telemetry.schema import DeviceSample
from specwatch.telemetry.sink import TelemetrySink

RAPL_ENERGY = Path("/sys/class/powercap/intel-rapl:0/energy_uj")


@dataclass(frozen=True)
class Memory:
    allocated: int
    reserved: int

    @property
    def fragmentation(self) -> float | None:
        return self.reserved / self.allocated if self.allocated else None


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _load_mallinfo2():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        function = libc.mallinfo2
    except (OSError, AttributeError):
        return None  # not glibc >= 2.33
    function.restype = _MallInfo2
    return function


_MALLINFO2 = _load_mallinfo2()


def cpu_heap_memory() -> Memory | None:
    if _MALLINFO2 is None:
        return None
    info = _MALLINFO2()
    return Memory(allocated=info.uordblks + info.hblkhd, reserved=info.arena + info.hblkhd)


def cuda_memory(device: torch.device) -> Memory:
    stats = torch.cuda.memory_stats(device)
    return Memory(stats.get("allocated_bytes.all.current", 0), stats.get("reserved_bytes.all.current", 0))


CPU_WATTS_PER_BUSY_CORE = 12.0  # a rough per-core figure for the estimate; every such value is labelled 'estimate'


class PowerMeter:
    """Average watts between readings, from an energy counter: NVML, RAPL, or else an
    estimate (this process's CPU seconds x CPU_WATTS_PER_BUSY_CORE), labelled 'estimate'."""

    def __init__(self, device: torch.device, watts_per_busy_core: float = CPU_WATTS_PER_BUSY_CORE) -> None:
        self.source: str | None = None
        self._read = None
        if device.type == "cuda":
            self._read = _nvml_energy_reader(device)
            self.source = "nvml" if self._read else None
        elif RAPL_ENERGY.is_file():
            try:
                RAPL_ENERGY.read_text()
                self._read, self.source = (lambda: int(RAPL_ENERGY.read_text()) / 1e6), "rapl"
            except OSError:
                pass
        if self._read is None and device.type == "cpu":
            self._read, self.source = (lambda: time.process_time() * watts_per_busy_core), "estimate"
        self._last = (time.monotonic(), self._read()) if self._read else None

    def watts(self) -> float | None:
        if self._read is None or self._last is None:
            return None
        now, joules = time.monotonic(), self._read()
        (then, before), self._last = self._last, (now, joules)
        if now <= then or joules < before:  # counter wrapped: skip one interval
            return None
        return (joules - before) / (now - then)


def nvml_handle(device: torch.device):
    """The NVML handle of a CUDA device (None without nvidia-ml-py or a driver).

    Matched by UUID: NVML numbers every GPU of the machine, CUDA only the visible ones
    (CUDA_VISIBLE_DEVICES), so index i need not be the same GPU in both."""
    try:
        import pynvml  # nvidia-ml-py

        pynvml.nvmlInit()
        index = device.index if device.index is not None else torch.cuda.current_device()
    except Exception:
        return None
    try:
        wanted = _bare_uuid(torch.cuda.get_device_properties(index).uuid)
        for i in range(pynvml.nvmlDeviceGetCount()):
            handle = pynvml.nvmlDeviceGetHandleByIndex(i)
            if _bare_uuid(pynvml.nvmlDeviceGetUUID(handle)) == wanted:
                return handle
    except Exception:
        pass
    try:
        return pynvml.nvmlDeviceGetHandleByIndex(index)
    except Exception:
        return None


def _bare_uuid(uuid) -> str:
    text = uuid.decode() if isinstance(uuid, bytes) else str(uuid)
    return text.lower().removeprefix("gpu-")


def _nvml_energy_reader(device: torch.device):
    handle = nvml_handle(device)
    if handle is None:
        return None
    try:
        import pynvml

        pynvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    except Exception:
        return None  # e.g. a GPU older than Volta has no energy counter
    return lambda: pynvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000.0  # mJ -> J


class Periodic:
    """A daemon thread that calls `tick()` every `interval_s` until `stop()`."""

    def __init__(self, interval_s: float, name: str) -> None:
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)

    def tick(self) -> None:
        raise NotImplementedError

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.tick()


class DeviceSampler(Periodic):
    """A background thread that hands the engine's state to `telemetry` as a DeviceSample every `interval_s`."""

    def __init__(self, scheduler, sink: TelemetrySink, interval_s: float) -> None:
        super().__init__(interval_s, "specwatch-device-sampler")
        self.scheduler, self.sink = scheduler, sink
        self.device = scheduler.engine.target.device
        self.power = PowerMeter(self.device)
        self._busy = (0.0, 0.0)
        self._last = time.monotonic()

    def tick(self) -> None:
        self.sink.put(self.sample())

    def sample(self) -> DeviceSample:
        now = time.monotonic()
        busy = self.scheduler.busy
        elapsed = max(now - self._last, 1e-9)
        util_target = min(1.0, (busy.target_s - self._busy[0]) / elapsed)
        util_draft = min(1.0, (busy.draft_s - self._busy[1]) / elapsed)
        self._busy, self._last = (busy.target_s, busy.draft_s), now
        memory = cuda_memory(self.device) if self.device.type == "cuda" else cpu_heap_memory() or Memory(0, 0)
        watts = self.power.watts()
        state = self.scheduler.policy.state
        return DeviceSample(
            instance=self.sink.instance,
            at=time.time(),
            device=_device_name(self.device),
            mem_allocated_bytes=memory.allocated,
            mem_reserved_bytes=memory.reserved,
            fragmentation=memory.fragmentation,
            power_w=watts,
            power_source=self.power.source if watts is not None else None,
            util_target=util_target,
            util_draft=util_draft,
            active_requests=self.scheduler.active,
            queue_depth=self.scheduler.queue_depth,
            load=self.scheduler.load,
            draft_loaded=state.get("draft_loaded", True),
            default_mode="speculative" if state["load_allows_speculation"] else "autoregressive",
        )


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)[:128]
    return "cpu"
