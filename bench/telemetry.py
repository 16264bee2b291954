"""Telemetry overhead per request against the request's own end-to-end latency, in one run.

    python bench/telemetry.py [--requests 6] [--records 3000] [--max-tokens 64]

1. Real requests on the bundled model (grounded, code edit, chat; n-gram drafter) give
   the mean end-to-end latency and real telemetry records.
2. Those records (fresh ids) then go through everything telemetry does per request in the
   engine: building the RequestRecord (pydantic validation) and handing it to the engine's
   TelemetrySink, which updates the Prometheus metrics and calls `TelemetryClient.submit_request`,
   whose background thread encodes and POSTs batches to a real collector (a child process on a
   temporary SQLite file).
   - on the scheduler thread: wall time of record + sink (metrics, submit) (what delays decoding);
   - whole process: CPU seconds of every thread (flush thread's encoding and HTTP included)
     until the collector acknowledged every record, per record.
Goal: < 1% of e2e latency.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from prometheus_client import CollectorRegistry  # noqa: E402

from specwatch.common.procs import free_port, start_collector  # noqa: E402
from specwatch.engine.engine import Engine, EngineConfig, GenerateRequest  # noqa: E402
from specwatch.engine.metrics import EngineMetrics  # noqa: E402
from specwatch.engine.policy import Policy  # noqa: E402
from specwatch.engine.scheduler import Scheduler, SchedulerConfig  # noqa: E402
from specwatch.telemetry.client import TelemetryClient  # noqa: E402
from specwatch.telemetry.schema import RequestRecord  # noqa: E402
from specwatch.telemetry.sink import TelemetrySink  # noqa: E402
from specwatch.workload import chat  # noqa: E402

SCENARIOS = ("grounded", "code-edit", "chat")


def real_records(engine: Engine, requests: int, max_tokens: int) -> list[RequestRecord]:
    records = []
    for i in range(requests):
        scenario = SCENARIOS[i % len(SCENARIOS)]
        result = engine.generate(
            GenerateRequest(messages=chat(scenario), max_tokens=max_tokens, tags={"scenario": scenario})
        )
        records.append(result.record)
        print(f"  request {i + 1}/{requests}: {result.record.e2e_s * 1000:.0f} ms", file=sys.stderr, flush=True)
    return records


def telemetry_cost(engine: Engine, records: list[RequestRecord], count: int, url: str) -> tuple[float, float]:
    """(scheduler-thread seconds per record, process CPU seconds per record until acknowledged)."""
    fields = [r.model_dump() for r in records]
    batch = [dict(fields[i % len(fields)], request_id=uuid.uuid4().hex) for i in range(count)]
    with TelemetryClient(url) as client:
        sink = TelemetrySink("bench", client)
        metrics = EngineMetrics(Scheduler(engine, SchedulerConfig(), Policy(), sink), CollectorRegistry())
        sink.subscribe(RequestRecord, metrics.observe)  # as the engine's /metrics does
        cpu_started, on_thread = time.process_time(), 0.0
        for values in batch:
            started = time.perf_counter()
            record = RequestRecord(**values)  # what Run._record does
            sink.put(record)  # what the scheduler does with it
            on_thread += time.perf_counter() - started
        if not client.flush(timeout=120):
            raise SystemExit("the collector did not acknowledge every record in 120 s")
        cpu = time.process_time() - cpu_started
        delivered = client.stats().delivered
    if delivered != count:
        raise SystemExit(f"{delivered} of {count} records delivered")
    return on_thread / count, cpu / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=6)
    parser.add_argument("--records", type=int, default=3000)
    parser.add_argument("--max-tokens", type=int, default=64)
    args = parser.parse_args()
    engine = Engine(EngineConfig(instance="bench-telemetry"))
    records = real_records(engine, args.requests, args.max_tokens)
    e2e = sum(r.e2e_s for r in records) / len(records)
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        collector = start_collector(port, Path(tmp) / "collector.log", f"sqlite:///{tmp}/bench.db")
        try:
            on_thread, cpu = telemetry_cost(engine, records, args.records, f"http://127.0.0.1:{port}")
        finally:
            collector.terminate()
            collector.wait(timeout=30)
    print(f"mean e2e latency of {len(records)} real requests: {e2e * 1000:.0f} ms")
    print(
        f"scheduler thread per request (record + metrics + submit): {on_thread * 1e6:.0f} us "
        f"= {100 * on_thread / e2e:.3f}% of e2e"
    )
    print(
        f"process CPU per request, every thread, until acknowledged: {cpu * 1e6:.0f} us "
        f"= {100 * cpu / e2e:.3f}% of e2e "
        f"({'within' if cpu / e2e < 0.01 else 'NOT within'} the 1% goal)"
    )


if __name__ == "__main__":
    main()
