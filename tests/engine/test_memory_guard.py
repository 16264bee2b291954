"""Memory hot swap on the real engine: readings above `high` unload the early-exit draft
(its requests decode plainly, mode_reason 'memory'), readings between the marks change
nothing, and a reading below `low` loads it again. The readings are the test's input; the
unload/reload, the policy and the requests are the real ones."""

from __future__ import annotations

import httpx
import pytest
from engine_harness import BackgroundServer

from specwatch.engine.memory_guard import MemoryGuard, MemoryGuardConfig, used_fraction
from specwatch.engine.policy import PolicyConfig
from specwatch.engine.scheduler import SchedulerConfig
from specwatch.telemetry.schema import EngineEvent

DRAFTER = "early-exit:4"


def complete(server: BackgroundServer):
    body = {"prompt": "Name three colours.", "max_tokens": 6, "temperature": 0, "drafter": DRAFTER, "gamma": 2}
    assert httpx.post(f"{server.url}/v1/completions", json=body, timeout=120).status_code == 200
    return server.records[-1]


def test_drafts_unload_under_pressure_and_return_after_it(bundled_engine):
    readings, events = iter([0.95, 0.97, 0.85, 0.70]), []
    policy = PolicyConfig(min_acceptance=0.0)
    with BackgroundServer(bundled_engine, SchedulerConfig(slots=1, max_queue=4), policy) as server:
        server.sink.subscribe(EngineEvent, events.append)  # the guard's, and the policy's mode switches
        guard = MemoryGuard(server.scheduler, MemoryGuardConfig(high=0.9, low=0.8), read=lambda device: next(readings))
        assert (complete(server).mode, complete(server).drafter) == ("speculative", DRAFTER)
        assert guard.check() == "unloaded"
        assert DRAFTER not in server.scheduler.slots[0].drafters
        record = complete(server)
        assert (record.mode, record.mode_reason) == ("autoregressive", "memory")
        assert guard.check() is None and guard.check() is None  # 0.97: already out; 0.85: inside the band
        assert complete(server).mode_reason == "memory"
        assert guard.check() == "reloaded"
        assert DRAFTER in server.scheduler.slots[0].drafters
        assert complete(server).mode == "speculative"
    unloaded, loaded = [e for e in events if e.kind != "mode_switch"]
    assert (unloaded.kind, loaded.kind) == ("draft_unloaded", "draft_loaded")
    assert unloaded.detail["reason"] == "memory" and unloaded.detail["used_fraction"] == 0.95
    assert unloaded.detail["unloaded"] == [DRAFTER] and loaded.detail["loaded"] == DRAFTER


def test_reading_this_machine_and_bad_marks():
    import torch

    used = used_fraction(torch.device("cpu"))
    assert used is None or 0.0 < used < 1.0
    with pytest.raises(ValueError):
        MemoryGuardConfig(high=0.8, low=0.9)
