"""How many torch (OpenMP) threads the engine runs its forwards on.

A forward's kernels split work over OpenMP threads that meet at a barrier after every op, so the
slowest thread sets the pace: one that shares its core with anything else (another process) stalls
the whole team. On the 2-core machine this was first measured on (`python bench/threads.py`, one
spinning process beside the engine), 2 threads went from 19.1 to 40.0 ms a decode step (2.1x) while
1 thread went from 18.3 to 25.0 (1.37x) and was as fast when the machine was quiet; so the default
was the physical cores less one.

A scheduler round that verifies several requests in one forward runs on `batch_threads`, by
default `threads` too (`--batch-threads N` overrides). Rounds once ran on the cores less one: on
the scheduler's thread a team of 2 was slower than 1 (87.7-88.4 against 61.7-68.9 ms a round of 8,
compiled bf16, 2-core Zen 4 EPYC). The cause was not the server's Python but libgomp, which spins
too briefly at its barriers once it manages more threads than there are CPUs: the thread that had
loaded and compiled the model kept its own idle team (see `release_openmp_workers`, which a
scheduler now calls). With that team freed, on that machine (8 clients x 2 requests of
bench/vs_vllm.py's prompts over HTTP to an in-process server, `--threads 2`): rounds of 8 took
33-35 ms on 2 threads and 46-47 ms on 1 (100-105 against 87-89 tok/s); one client at a time, a
decode step took 14.7 ms against 23.7-26.8 before (51.5 against 31-35 tok/s).

With that team freed, a team of all the cores is the faster one on a quiet machine, and still the
one that loses most beside a busy process (`python bench/threads.py --compile`, bf16, 2-core Zen 4
EPYC: 2 threads 15.4 ms a step quiet, 33.0 beside one spinning process; 1 thread 25.3 and 26.3).
So by default the count follows the machine (`CpuShare`): every forward takes the physical cores
this process may run on less the CPUs other processes kept busy over the last quarter second, at
least one. `--threads N` fixes it at N.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import time
from collections.abc import Iterator
from pathlib import Path

SYSFS_CPUS = Path("/sys/devices/system/cpu")
PROC_MAPS = Path("/proc/self/maps")
PROC_STAT = Path("/proc/stat")
OMP_PAUSE_SOFT = 1  # omp_pause_resource_t (OpenMP 5.0)

log = logging.getLogger("specwatch.threads")


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


def busy_ticks(cpus: set[int], stat: Path = PROC_STAT) -> int | None:
    """Clock ticks `cpus` spent busy since boot (user, nice, system, irq, softirq, and steal: time the
    hypervisor gave another guest), from /proc/stat; None without it (macOS)."""
    try:
        lines = stat.read_text().splitlines()
    except OSError:
        return None
    total = 0
    for line in lines:
        name, *fields = line.split() or [""]
        if name.startswith("cpu") and name[3:].isdigit() and int(name[3:]) in cpus and len(fields) >= 8:
            user, nice, system, _idle, _iowait, irq, softirq, steal = (int(f) for f in fields[:8])
            total += user + nice + system + irq + softirq + steal  # guest time is inside user and nice
    return total


class CpuShare:
    """Torch threads for the next forward, where --threads was not set: the physical cores this
    process may run on less the CPUs that other processes kept busy (others' CPU time, rounded, over
    the last `interval_s`), at least one (see the module docstring). Where /proc/stat is missing it
    stays at all the cores."""

    def __init__(self, interval_s: float = 0.25, stat: Path = PROC_STAT, clock=time.monotonic) -> None:
        self.cpus = os.sched_getaffinity(0)
        self.cores = physical_cores(self.cpus)
        self.interval_s, self.stat, self.clock = interval_s, stat, clock
        self.current = self.cores
        self._last = self._sample()

    def threads(self) -> int:
        """The count for the next forward (/proc/stat read at most once an interval)."""
        now = self.clock()
        if now - self._last[0] >= self.interval_s:
            sample = self._sample()
            if sample[1] is not None and self._last[1] is not None:
                self.current = self.choose(sample, self._last)
            self._last = sample
        return self.current

    def choose(self, now: tuple, before: tuple) -> int:
        """Threads from two samples (monotonic s, busy ticks of our CPUs, this process's CPU s)."""
        wall = now[0] - before[0]
        others = (now[1] - before[1]) / TICKS_PER_S - (now[2] - before[2])  # CPU s others used there
        busy = max(0, int(others / wall + 0.5)) if wall > 0 else 0  # a CPU half busy counts
        return max(1, self.cores - busy)

    def _sample(self) -> tuple[float, int | None, float]:
        times = os.times()
        return self.clock(), busy_ticks(self.cpus, self.stat), times.user + times.system


TICKS_PER_S = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@contextlib.contextmanager
def using(threads: int) -> Iterator[None]:
    """torch's intra-op threads set to `threads` for the block (in this thread), then restored."""
    import torch

    before = torch.get_num_threads()
    if threads == before:
        yield
        return
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def loaded_libgomp(maps: Path = PROC_MAPS) -> str | None:
    """The path of the GNU OpenMP runtime this process has loaded (torch's on Linux), or None."""
    try:
        lines = maps.read_text().splitlines()
    except OSError:  # no procfs (macOS)
        return None
    for line in lines:
        fields = line.split(maxsplit=5)  # address, perms, offset, device, inode, path (which may hold spaces)
        if len(fields) == 6 and Path(fields[5]).name.startswith("libgomp"):
            return fields[5]
    return None


def release_openmp_workers(maps: Path = PROC_MAPS) -> bool:
    """Free the OpenMP worker threads the calling thread started, before another thread takes over
    the forwards (the scheduler's, from the thread that loaded and compiled the model).

    Every thread that runs a multi-threaded op keeps its own team of workers, and once libgomp
    manages more threads than the process has CPUs it spins ~100 times at a barrier instead of
    ~300,000 before it sleeps: each kernel of a forward then sleeps and wakes its workers. On the
    2-core Zen 4 EPYC a compiled bf16 round of 8 requests on 2 threads took 35 ms on the main
    thread, 69 ms on another while the main thread's team stood idle, and 42 ms once that team was
    freed (libgomp's omp_pause_resource_all frees the caller's team only). False where torch's
    OpenMP runtime is not libgomp (nothing to do) or the call fails."""
    path = loaded_libgomp(maps)
    if path is None:
        return False
    try:
        pause = ctypes.CDLL(path).omp_pause_resource_all
    except (OSError, AttributeError):  # a libgomp older than OpenMP 5.0 (GCC 9)
        return False
    pause.argtypes, pause.restype = [ctypes.c_int], ctypes.c_int
    if pause(OMP_PAUSE_SOFT) != 0:
        log.warning("could not free this thread's OpenMP workers (%s)", path)
        return False
    return True
