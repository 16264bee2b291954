"""The default torch thread count: physical cores this process may use, less one, at least one."""

from __future__ import annotations

import os

from engine.threads import default_threads, physical_cores


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
