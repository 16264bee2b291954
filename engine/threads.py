"""How many torch (OpenMP) threads the engine runs its forwards on by default.

A forward's kernels split work over OpenMP threads that meet at a barrier after every op, so the
slowest thread sets the pace: one that shares its core with anything else (the server's own
event loop and tokenizer, another process) stalls the whole team. On the 2-core machine this was
measured on (`python bench/threads.py`, one spinning process beside the engine), 2 threads went
from 19.1 to 40.0 ms a decode step (2.1x) while 1 thread went from 18.3 to 25.0 (1.37x) and was
as fast when the machine was quiet. So: one thread per physical core this process may run on,
less one core left to the server's Python threads; at least one. `--threads N` overrides it.
"""

from __future__ import annotations

import os
from pathlib import Path

SYSFS_CPUS = Path("/sys/devices/system/cpu")


def physical_cores(cpus: set[int] | None = None, sysfs: Path = SYSFS_CPUS) -> int:
    """Distinct physical cores among `cpus` (default: those this process may run on); SMT siblings count once."""
    cpus = cpus if cpus is not None else os.sched_getaffinity(0)
    cores = set()
    for cpu in cpus:
        siblings = sysfs / f"cpu{cpu}" / "topology" / "thread_siblings_list"
        try:
            cores.add(siblings.read_text().strip())
        except OSError:  # no sysfs (macOS, containers without it): count the logical CPU
            cores.add(str(cpu))
    return max(1, len(cores))


def default_threads() -> int:
    return max(1, physical_cores() - 1)
