"""Concurrent requests through the engine server all complete, and their telemetry reaches a real collector."""

from __future__ import annotations

import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import torch
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine, text
from waiting import wait_for

from specwatch.common.procs import child_env, free_port, specwatch_command, start_collector, start_service, stop_process
from specwatch.engine.device import DeviceSampler, cpu_heap_memory
from specwatch.telemetry.client import TelemetryClient
from specwatch.telemetry.sink import TelemetrySink
from tests.engine.test_server import Server

REPO = Path(__file__).resolve().parents[2]


def test_concurrent_requests_reach_the_collector(bundled_engine, tmp_path):
    port = free_port()
    collector = start_collector(port, tmp_path / "collector.log", env={"SPECWATCH_DATA_DIR": str(tmp_path)})
    client = TelemetryClient(f"http://127.0.0.1:{port}", spool_dir=tmp_path / "spool", flush_interval_s=0.2)
    try:
        sink = TelemetrySink("test", client)
        with Server(bundled_engine, slots=4, sink=sink) as server:
            sampler = DeviceSampler(server.scheduler, sink, 0.5)
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
            sink.put(sampler.sample())
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


def stored_requests(db: Path) -> list[str]:
    store = create_engine(f"sqlite:///{db}")
    with store.connect() as conn:
        ids = list(conn.scalars(text("SELECT request_id FROM requests")))
    store.dispose()
    return ids


def gauge(metrics_text: str, name: str) -> float:
    samples = {s.name: s.value for family in text_string_to_metric_families(metrics_text) for s in family.samples}
    return samples[name]


def test_engine_serve_sends_its_collector_token(tmp_path):
    """`engine serve` takes SPECWATCH_INGEST_TOKEN (the --collector-token default): every record is stored."""
    port, engine_port, db = free_port(), free_port(), tmp_path / "collector.db"
    token = {"SPECWATCH_INGEST_TOKEN": "s3cret"}
    collector = start_collector(
        port, tmp_path / "collector.log", f"sqlite:///{db}", {**token, "SPECWATCH_DATA_DIR": str(tmp_path)}
    )
    command = specwatch_command(
        "engine", "serve", "--port", str(engine_port), "--collector", f"http://127.0.0.1:{port}"
    )
    command += ["--spool-dir", str(tmp_path / "spool"), "--instance", "tokened", "--sample-interval", "0.5"]
    url = f"http://127.0.0.1:{engine_port}"
    engine = start_service("engine", command, child_env(token), tmp_path / "engine.log", f"{url}/v1/models", 300)
    try:
        for word in ("red", "green", "blue"):
            body = {"prompt": f"Repeat: {word} {word}", "max_tokens": 4, "temperature": 0}
            assert httpx.post(f"{url}/v1/completions", json=body, timeout=120).status_code == 200
        wait_for(lambda: len(stored_requests(db)) == 3, "the engine's 3 records in the collector", timeout=30)
        assert gauge(httpx.get(f"{url}/metrics").text, "specwatch_telemetry_auth_failing") == 0
    finally:
        stop_process(engine, timeout_s=30)
        stop_process(collector, timeout_s=30)
    assert "ingest token" not in (tmp_path / "engine.log").read_text()


def test_a_refused_token_shows_on_metrics_and_nothing_is_lost(bundled_engine, tmp_path):
    port, db = free_port(), tmp_path / "collector.db"
    env = {"SPECWATCH_INGEST_TOKEN": "right", "SPECWATCH_DATA_DIR": str(tmp_path)}
    collector = start_collector(port, tmp_path / "collector.log", f"sqlite:///{db}", env)
    collector_url = f"http://127.0.0.1:{port}"
    client = TelemetryClient(collector_url, tmp_path / "spool", token="wrong", flush_interval_s=0.1)
    try:
        with Server(bundled_engine, sink=TelemetrySink("wrong-token", client)) as server:
            for word in ("red", "green"):
                server.client().completions.create(model=None, prompt=f"Say {word}", max_tokens=4, temperature=0)
            assert client.flush(10.0)
            metrics = httpx.get(f"{server.url}/metrics").text
        client.close()
        assert gauge(metrics, "specwatch_telemetry_auth_failing") == 1
        assert gauge(metrics, "specwatch_telemetry_spool_bytes") > 0 and stored_requests(db) == []
        fixed = TelemetryClient(collector_url, tmp_path / "spool", token="right", flush_interval_s=0.05)
        wait_for(lambda: fixed.flush(5.0) and fixed.stats().spool_bytes == 0, "the spool to drain", timeout=30)
        fixed.close()
    finally:
        stop_process(collector, timeout_s=30)
    assert sorted(stored_requests(db)) == sorted(set(stored_requests(db))) and len(stored_requests(db)) == 2


def test_an_unusable_collector_token_is_exit_2():
    done = subprocess.run(
        specwatch_command("engine", "serve", "--collector", "http://127.0.0.1:9", "--collector-token", "two words"),
        env=child_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and "printable ASCII" in done.stderr and "Traceback" not in done.stderr


def test_cpu_heap_reading_is_sane():
    memory = cpu_heap_memory()
    assert memory is not None and memory.reserved >= memory.allocated > 0
    assert memory.fragmentation >= 1.0


def test_power_without_a_counter_is_labelled_estimate():
    from specwatch.engine.device import RAPL_ENERGY, PowerMeter

    meter = PowerMeter(torch.device("cpu"))
    sum(i * i for i in range(300_000))  # burn some CPU
    watts = meter.watts()
    expected = "rapl" if RAPL_ENERGY.is_file() else "estimate"
    assert meter.source == expected and watts is not None and watts > 0
