"""The engine API on a free loopback port in a background thread, for tests and benchmarks
(`from engine_harness import BackgroundServer`; the benches put tests/ on sys.path)."""

from __future__ import annotations

import threading
import time

import uvicorn

from collector.schema import RequestRecord
from engine.policy import Policy, PolicyConfig
from engine.scheduler import Scheduler, SchedulerConfig
from engine.server import create_app
from engine.telemetry import TelemetrySink
from specwatch.common import free_port


class BackgroundServer:
    """`records` collects every finished request's telemetry record; `telemetry` is the engine's sink
    (a fresh one unless given), which a PolicyConfig's policy shares; a given Policy keeps its own."""

    def __init__(
        self,
        engine,
        scheduler_config: SchedulerConfig,
        policy: PolicyConfig | Policy = PolicyConfig(),
        telemetry: TelemetrySink | None = None,
        **app_options,
    ) -> None:
        self.records: list[RequestRecord] = []
        self.telemetry = telemetry or TelemetrySink(engine.config.instance)
        self.telemetry.subscribe(RequestRecord, self.records.append)
        policy = policy if isinstance(policy, Policy) else Policy(policy, telemetry=self.telemetry)
        self.scheduler = Scheduler(engine, scheduler_config, policy, self.telemetry)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        config = uvicorn.Config(
            create_app(self.scheduler, engine.target.name, **app_options), port=self.port, log_level="warning"
        )
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> BackgroundServer:
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.05)
        if not self.server.started:
            raise RuntimeError(f"the engine server did not start on {self.url}")
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)

    def client(self):
        import openai

        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0)
