"""Concurrent requests through the engine server all complete, and their telemetry reaches a real collector."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import torch

from collector.client import TelemetryClient
from engine.device import DeviceSampler, cpu_heap_memory
from engine.telemetry import TelemetrySink
from specwatch.common import free_port, start_collector
from tests.engine.test_server import Server

REPO = Path(__file__).resolve().parents[2]


def test_concurrent_requests_reach_the_collector(bundled_engine, tmp_path):
    port = free_port()
    collector = start_collector(port, tmp_path / "collector.log", env={"SPECWATCH_DATA_DIR": str(tmp_path)})
    client = TelemetryClient(f"http://127.0.0.1:{port}", spool_dir=tmp_path / "spool", flush_interval_s=0.2)
    try:
        telemetry = TelemetrySink("test", client)
        with Server(bundled_engine, slots=4, telemetry=telemetry) as server:
            sampler = DeviceSampler(server.scheduler, telemetry, 0.5)
            openai_client = server.client()
            prompts = [
                f"Repeat: {word} {word} {word} and then {word}"
                for word in ("red", "green", "blue", "amber", "cyan", "plum")
            ]
            with ThreadPoolExecutor(6) as pool:
                replies = list(
                    pool.map(
                        lambda p: openai_client.completions.create(
                            model=None, prompt=p, max_tokens=12, temperature=0, extra_body={"tags": {"scenario": "e2e"}}
                        ),
                        prompts,
                    )
                )
            telemetry.put(sampler.sample())
        assert all(r.choices[0].text for r in replies)
        client.flush(timeout=10)
        signals = httpx.get(f"http://127.0.0.1:{port}/v1/signals", params={"last": 600, "tag": "scenario:e2e"}).json()
        devices = httpx.get(f"http://127.0.0.1:{port}/v1/devices/latest").json()
    finally:
        client.close()
        collector.terminate()
        collector.wait(timeout=30)
    assert signals["requests"] == 6
    assert any(
        d.get("instance") == "test" for d in (devices if isinstance(devices, list) else devices.get("devices", []))
    )


def test_cpu_heap_reading_is_sane():
    memory = cpu_heap_memory()
    assert memory is not None and memory.reserved >= memory.allocated > 0
    assert memory.fragmentation >= 1.0


def test_power_without_a_counter_is_labelled_estimate():
    from engine.device import RAPL_ENERGY, PowerMeter

    meter = PowerMeter(torch.device("cpu"))
    sum(i * i for i in range(300_000))  # burn some CPU
    watts = meter.watts()
    expected = "rapl" if RAPL_ENERGY.is_file() else "estimate"
    assert meter.source == expected and watts is not None and watts > 0
