"""What each instance runs on: its own GPU type, count and pricing, and the deployment's share of it.

    gpu_type_of(device name, prices)            the price table row a DeviceSample.device names
    infer_gpu_type(db, window, prices)          the row of the most sampled device (the inputs' gpu_type)
    pick_devices(db, window, prices, names, choice)   one `Device` per instance:
        an explicit GPU (--gpu)    every instance as that GPU (a fleet file still declares devices dedicated)
        else a fleet file entry    its gpu_type, gpu_count, pricing, $/GPU-hour, commitment, dedicated
        else its device samples    the row its most sampled device name matches
        else                       the inputs' gpu_type, marked an estimate
    shares(memory rows, devices, capacity)      the deployment's share of each instance: median reserved
                                                memory / its GPUs' memory (<= 1); 1 when declared dedicated

vLLM reserves `gpu_memory_utilization` of a device whatever it serves, so reserved memory below the
device's does not prove other tenants: only a fleet file's `dedicated = true` says there are none.
The fleet file itself is read by `cost.inputs.load_fleet`.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from sqlalchemy import Engine

from specwatch.collector.reads.queries import Filters, Window
from specwatch.collector.reads.usage import device_counts, instance_devices
from specwatch.cost.instances import ESTIMATE, GIVEN, SAMPLED, Device
from specwatch.cost.terms import Prices

DEDICATED = "dedicated (fleet file)"
# Device names (DeviceSample.device) -> price table rows: the first pattern that matches.
DEVICE_PATTERNS = (
    ("H200", r"\bH200\b"),
    ("H100-SXM", r"\bH100\b"),
    ("A100-80GB", r"\bA100\b"),
    ("L4", r"\bL4\b"),
    ("cpu-laptop", r"^cpu$"),
)


@dataclass(frozen=True)
class Fleet:
    """A fleet file: what each named instance runs on and how it is paid for (source FLEET)."""

    devices: tuple[Device, ...]
    path: str = ""

    def get(self, instance: str) -> Device | None:
        return next((d for d in self.devices if d.instance == instance), None)


@dataclass(frozen=True)
class DeviceChoice:
    """How to pick each instance's device: `gpu_type` for every instance when `per_instance` is False (an
    explicit --gpu), else the fallback for an instance no fleet entry or device sample names."""

    gpu_type: str
    fleet: Fleet | None = None
    per_instance: bool = False


def gpu_type_of(device: str, prices: Prices) -> str | None:
    """The price table row a device name matches (DEVICE_PATTERNS), None: none."""
    for gpu_type, pattern in DEVICE_PATTERNS:
        if gpu_type in prices.accelerators and re.search(pattern, device, re.IGNORECASE):
            return gpu_type
    return None


def infer_gpu_type(db: Engine, window: Window, prices: Prices) -> str | None:
    """The price table row of the device most samples in the window came from (None: no match)."""
    return next(filter(None, (gpu_type_of(device, prices) for device, _ in device_counts(db, window))), None)


def sampled_gpu_types(rows: Iterable[tuple[str, str, int]], prices: Prices) -> dict[str, str]:
    """Instance -> the row of its most sampled device that the price table knows."""
    found: dict[str, str] = {}
    for instance, device, _ in rows:  # most sampled first
        gpu_type = gpu_type_of(device, prices)
        if gpu_type is not None:
            found.setdefault(instance, gpu_type)
    return found


def pick_devices(
    db: Engine, window: Window, prices: Prices, names: Iterable[str], choice: DeviceChoice, filters: Filters = Filters()
) -> tuple[Device, ...]:
    """One device per named instance (module docstring)."""
    sampled = sampled_gpu_types(instance_devices(db, window, filters), prices) if choice.per_instance else {}
    return tuple(_device(name, choice, sampled) for name in sorted(set(names)))


def _device(name: str, choice: DeviceChoice, sampled: dict[str, str]) -> Device:
    entry = choice.fleet.get(name) if choice.fleet else None
    if not choice.per_instance:
        return Device(name, choice.gpu_type, dedicated=bool(entry and entry.dedicated), source=GIVEN)
    if entry is not None:
        return entry
    if name in sampled:
        return Device(name, sampled[name], source=SAMPLED)
    return Device(name, choice.gpu_type, source=ESTIMATE)


def shares(
    rows: list[tuple], devices: tuple[Device, ...], capacity: Callable[[Device], float]
) -> dict[str, tuple[float, str]]:
    """Instance -> (the deployment's share of its devices, source): median reserved bytes / `capacity`
    (its GPUs' bytes), capped at 1; (1, DEDICATED) when its device is declared dedicated."""
    held: dict[str, list[float]] = defaultdict(list)
    for instance, reserved, _ in rows:
        held[instance].append(float(reserved))
    by_name = {d.instance: d for d in devices}
    found = {}
    for name, values in held.items():
        device = by_name.get(name)
        if device is not None:
            found[name] = (min(statistics.median(values) / capacity(device), 1.0), "measured")
    return found | {d.instance: (1.0, DEDICATED) for d in devices if d.dedicated}
