"""The default torch thread count: per forward, the physical cores this process may use less the CPUs
other processes keep busy, at least one; a batched round's: the same unless told. Freeing a thread's
OpenMP workers (libgomp) before another thread runs the forwards."""

from __future__ import annotations

import os

import pytest
import torch

from specwatch.engine.threads import (
    TICKS_PER_S,
    CpuShare,
    busy_ticks,
    loaded_libgomp,
    physical_cores,
    release_openmp_workers,
    using,
)


def _sysfs(tmp_path, siblings: dict[int, str]):
    for cpu, text in siblings.items():
        topology = tmp_path / f"cpu{cpu}" / "topology"
        topology.mkdir(parents=True)
        (topology / "thread_siblings_list").write_text(text + "\n")
    return tmp_path


def test_smt_siblings_count_as_one_core(tmp_path):
    sysfs = _sysfs(tmp_path, {0: "0,4", 4: "0,4", 1: "1,5", 5: "1,5", 2: "2,6"})
    assert physical_cores({0, 4, 1, 5, 2}, sysfs) == 3
    assert physical_cores({0, 4}, sysfs) == 1


def test_without_sysfs_each_cpu_counts_and_never_below_one(tmp_path):
    assert physical_cores({0, 1, 2}, tmp_path) == 3
    assert physical_cores(set(), tmp_path) == 1


def _stat(path, ticks: dict[int, tuple[int, ...]]):
    """A /proc/stat with `ticks` per CPU: user nice system idle iowait irq softirq steal guest guest_nice."""
    lines = ["cpu  " + " ".join(["1"] * 10)] + [f"cpu{cpu} " + " ".join(map(str, t)) for cpu, t in ticks.items()]
    path.write_text("\n".join(lines + ["intr 5 0 0", "ctxt 77"]) + "\n")
    return path


def test_busy_ticks_sum_our_cpus_busy_fields_steal_included_guest_not_twice(tmp_path):
    stat = _stat(tmp_path / "stat", {0: (10, 1, 2, 500, 7, 3, 4, 5, 6, 1), 1: (100, 0, 0, 0, 0, 0, 0, 0, 0, 0)})
    assert busy_ticks({0}, stat) == 10 + 1 + 2 + 3 + 4 + 5  # idle and iowait out; guest is inside user
    assert busy_ticks({0, 1}, stat) == 125
    assert busy_ticks({0}, tmp_path / "absent") is None  # no procfs (macOS)


def test_the_share_leaves_out_the_cpus_others_keep_busy():
    share = CpuShare()
    cores, tick = share.cores, 1 / TICKS_PER_S
    quiet = share.choose((1.0, 0 + int(cores * TICKS_PER_S), 1.0 + cores), (0.0, 0, 1.0))  # all of it ours
    assert quiet == cores
    one_busy = share.choose((2.0, 2 * TICKS_PER_S, 0.0), (0.0, 0, 0.0))  # 2 s of others' CPU over 2 s
    assert one_busy == max(1, cores - 1)
    assert share.choose((1.0, int(0.4 / tick), 0.0), (0.0, 0, 0.0)) == cores  # under half a CPU: not counted
    assert share.choose((1.0, 1000 * TICKS_PER_S, 0.0), (0.0, 0, 0.0)) == 1  # never below one


def test_the_share_reads_proc_stat_at_most_once_an_interval_and_follows_it(tmp_path):
    now = [0.0]
    stat = _stat(tmp_path / "stat", {cpu: (0,) * 10 for cpu in os.sched_getaffinity(0)})
    share = CpuShare(interval_s=0.25, stat=stat, clock=lambda: now[0])
    assert share.threads() == share.cores  # nothing measured yet: all of them
    cpu = min(share.cpus)
    others = int(200 * TICKS_PER_S)  # one CPU busy all of the 200 s (this process's own few ms aside)
    _stat(stat, {c: ((others if c == cpu else 0),) + (0,) * 9 for c in share.cpus})
    now[0] = 0.1
    assert share.threads() == share.cores  # within the interval: not read again
    now[0] = 200.0
    assert share.threads() == max(1, share.cores - 1)  # one CPU kept busy over the 200 s
    assert CpuShare(stat=tmp_path / "absent").threads() == CpuShare().cores  # no procfs: all of them


@pytest.mark.skipif(
    not os.path.exists("/proc/stat") or physical_cores() < 2, reason="needs /proc/stat and two physical cores"
)
def test_a_busy_process_on_one_of_our_cores_takes_a_thread_off():
    """A real spinning process, pinned to one of our CPUs: over the next interval the share leaves it that core."""
    import subprocess
    import sys
    import time

    spinner = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        os.sched_setaffinity(spinner.pid, {min(os.sched_getaffinity(0))})
        time.sleep(0.3)  # it runs
        share = CpuShare(interval_s=0.5)
        time.sleep(1.0)  # an interval that is all its
        assert share.threads() <= share.cores - 1
    finally:
        spinner.kill()
        spinner.wait()


def test_using_sets_the_threads_for_the_block_and_restores_them():
    before = torch.get_num_threads()
    other = 2 if before == 1 else 1
    with using(other):
        assert torch.get_num_threads() == other
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError), using(other):
        raise RuntimeError("a failed forward")
    assert torch.get_num_threads() == before


def test_engine_config_refuses_negative_threads():
    from specwatch.engine.engine import EngineConfig

    with pytest.raises(ValueError, match="batch_threads"):
        EngineConfig(batch_threads=-1)


def _maps(tmp_path, *paths: str):
    maps = tmp_path / "maps"
    lines = [f"7f0000000000-7f0000001000 r-xp 00000000 08:01 {i} {path}" for i, path in enumerate(paths, 1)]
    maps.write_text("\n".join(lines + ["7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]"]) + "\n")
    return maps


def test_the_loaded_libgomp_is_found_in_the_process_maps(tmp_path):
    lib = "/venv/lib/python3.11/site-packages/torch/lib/libgomp.so.1"
    assert loaded_libgomp(_maps(tmp_path, "/usr/lib/libc.so.6", lib)) == lib
    assert loaded_libgomp(_maps(tmp_path, "/usr/lib/libc.so.6", "/opt/intel/libiomp5.so")) is None
    assert loaded_libgomp(tmp_path / "absent") is None  # no procfs (macOS)
    assert release_openmp_workers(_maps(tmp_path, "/usr/lib/libc.so.6")) is False  # nothing to free


RELEASE = """
import os, torch
from specwatch.engine.threads import loaded_libgomp, release_openmp_workers
torch.set_num_threads(2)
x = torch.arange(1 << 24, dtype=torch.float64)
total = x.sum().item()  # a parallel region: this thread's team of 2 exists from here on
if loaded_libgomp() is None:
    print("no-libgomp")
else:
    before = len(os.listdir("/proc/self/task"))
    freed = release_openmp_workers()
    after = len(os.listdir("/proc/self/task"))
    again = x.sum().item()  # the thread's next parallel op builds a new team
    print(freed, before - after, again == total, len(os.listdir("/proc/self/task")) - after)
"""


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux procfs to count threads")
def test_release_frees_the_calling_threads_openmp_worker_and_ops_still_run():
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    out = subprocess.run(
        [sys.executable, "-c", RELEASE], capture_output=True, text=True, cwd=root, timeout=120, check=True
    ).stdout.split()
    if out == ["no-libgomp"]:
        pytest.skip("torch's OpenMP runtime here is not libgomp: nothing to free")
    freed, gone, same, rebuilt = out
    assert freed == "True" and gone == "1"  # the team's one worker thread exited
    assert same == "True" and rebuilt == "1"  # and a later op ran on a new team, with the same result
