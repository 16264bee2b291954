"""The default torch thread count: physical cores this process may use, less one, at least one; a batched
round's: at most that."""

from __future__ import annotations

import os

import pytest
import torch

from engine.threads import batch_threads, default_threads, physical_cores, using


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


def test_a_batched_round_never_takes_the_core_left_to_the_server():
    assert batch_threads(1) == 1
    assert batch_threads(default_threads() + 3) == default_threads()
    assert batch_threads(default_threads()) == default_threads()


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
