"""How many torch (OpenMP) threads the engine runs its forwards on by default.

A forward's kernels split work over OpenMP threads that meet at a barrier after every op, so the
slowest thread sets the pace: one that shares its core with anything else (the server's own
event loop and tokenizer, another process) stalls the whole team. On the 2-core machine this was
measured on (`python bench/threads.py`, one spinning process beside the engine), 2 threads went
from 19.1 to 40.0 ms a decode step (2.1x) while 1 thread went from 18.3 to 25.0 (1.37x) and was
as fast when the machine was quiet. So: one thread per physical core this process may run on,
less one core left to the server's Python threads; at least one. `--threads N` overrides it.

A scheduler round that verifies several requests in one forward runs on `batch_threads` (at most
the cores less one, whatever `--threads` says): while several clients are served the server's
event loop and the scheduler's per-request Python are busy too, and a team on every core stalls on
them. With --threads 2 on the 2-core Zen 4 EPYC (bf16, compiled, 8 clients, bench/vs_vllm.py's
prompts) a batched round of 8 took 87.7-88.4 ms on 2 threads and 61.7-68.9 ms on 1 (prompts
still on 2: 390-420 ms each): 54 against 62-68 tok/s. A prompt alone, or a single request's
forward, keeps `--threads`: nothing else is busy then, and a lone row or a prompt is faster on
every core (22.5 against 29.6 ms a bf16 step, 2 against 1 thread).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
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


def batch_threads(threads: int) -> int:
    """Threads for a forward of several requests at once, the engine's forwards taking `threads`."""
    return min(threads, default_threads())


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
