"""The default torch thread count: physical cores this process may use, less one, at least one; a batched
round's: the same unless told. Freeing a thread's OpenMP workers (libgomp) before another thread runs the
forwards."""

from __future__ import annotations

import os

import pytest
import torch

from engine.threads import default_threads, loaded_libgomp, physical_cores, release_openmp_workers, using


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


def test_the_default_leaves_a_core_to_the_server():
    assert default_threads() == max(1, physical_cores() - 1)
    assert 1 <= default_threads() <= len(os.sched_getaffinity(0))


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
    from engine.engine import EngineConfig

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
from engine.threads import loaded_libgomp, release_openmp_workers
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
