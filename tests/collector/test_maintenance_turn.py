"""The leader's background passes take turns: a roll-up never runs beside an alert cycle (in one
process a CPU-bound detector pass starved a roll-up holding the SQLite write lock: issue 30)."""

from __future__ import annotations

import asyncio
import threading
import time

from specwatch.collector import maintenance
from specwatch.collector.settings import Settings


def test_roll_ups_and_alert_cycles_never_overlap(monkeypatch):
    spans: list[tuple[str, float, float]] = []

    def job(name: str):
        def run(*args, **kwargs) -> None:
            started = time.monotonic()
            time.sleep(0.05)  # long enough for the other loop's thread to try to start in between
            spans.append((name, started, time.monotonic()))

        return run

    monkeypatch.setattr(maintenance, "run_once", job("roll-up"))
    settings = Settings(maintenance_interval_s=0.001)
    turn = threading.Lock()

    async def alert_loop() -> None:
        while True:
            await asyncio.to_thread(maintenance.in_turn, turn, job("alerts"))

    async def both() -> None:
        tasks = [
            asyncio.create_task(maintenance.maintenance_loop(None, settings, turn)),
            asyncio.create_task(alert_loop()),
        ]
        await asyncio.sleep(1.0)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    asyncio.run(both())
    spans.sort(key=lambda s: s[1])
    assert {name for name, _, _ in spans} == {"roll-up", "alerts"}
    assert all(earlier[2] <= later[1] for earlier, later in zip(spans, spans[1:]))  # one at a time
