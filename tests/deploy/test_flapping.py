"""bench/flapping.py: the 90 s window stops the flap the raw capacity causes, on every seed tried."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

import flapping  # noqa: E402


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_window_cuts_reversals(seed):
    demand, allowed = flapping.demand_trace(seed), flapping.episodes(seed)
    flappy = flapping.simulate(demand, allowed, 0, smoothed=False)
    held = flapping.simulate(demand, allowed, 90, smoothed=False)
    assert flappy.reversals >= 10 and held.reversals <= 3
    assert held.short_s < flappy.short_s
    assert held.replicas[-1] * flapping.PLAIN_TPS >= 5200 / flapping.TARGET * 0.9  # sized for the plain stretches
