"""The engine API on a free loopback port in a background thread, for tests and benchmarks
(`from engine_harness import BackgroundServer`; the benches put tests/ on sys.path)."""

from __future__ import annotations

import contextlib

from thread_server import ThreadServer

from specwatch.engine.policy import Policy, PolicyConfig
from specwatch.engine.scheduler import Scheduler, SchedulerConfig
from specwatch.engine.server import create_app
from specwatch.telemetry.schema import RequestRecord
from specwatch.telemetry.sink import TelemetrySink


class BackgroundServer(ThreadServer):
    """`records` collects every finished request's telemetry record; `telemetry` is the engine's sink
    (a fresh one unless given), which a PolicyConfig's policy shares; a given Policy keeps its own."""

    def __init__(
        self,
        engine,
        scheduler_config: SchedulerConfig,
        policy: PolicyConfig | Policy = PolicyConfig(),
        sink: TelemetrySink | None = None,
        **app_options,
    ) -> None:
        self.records: list[RequestRecord] = []
        self.sink = sink or TelemetrySink(engine.config.instance)
        self.sink.subscribe(RequestRecord, self.records.append)
        policy = policy if isinstance(policy, Policy) else Policy(policy, sink=self.sink)
        self.scheduler = Scheduler(engine, scheduler_config, policy, self.sink)
        super().__init__(create_app(self.scheduler, engine.target.name, **app_options))

    def client(self):
        import openai

        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", max_retries=0)


@contextlib.contextmanager
def spec_and_plain(engine):
    """(n-gram server, plain server) over one engine's model: a spec pool and a plain pool to test with."""
    spec = BackgroundServer(engine, SchedulerConfig(slots=4, max_queue=64), PolicyConfig(min_acceptance=0.0))
    plain = BackgroundServer(engine, SchedulerConfig(slots=4, max_queue=64), default_drafter="none")
    with spec, plain:
        yield spec, plain
