"""Processor sharing per upstream across gateways (issue 25 item 7): two real gateways in front of one
upstream no longer each charge its full time. The gateways tag their records `gateway=<--name>`; the
cost model re-derives their device time over both gateways' requests in flight there, so the shares
add up to the upstream's busy time and the bill still reconciles; with one gateway nothing changes."""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np
from collector_payloads import T0, plain_request_dict, sample_dict
from thread_server import ThreadServer

from specwatch.collector.db import make_db, upgrade
from specwatch.collector.ingest.store import Store
from specwatch.collector.reads.queries import Filters, Window
from specwatch.cost.allocation import allocate
from specwatch.cost.assumptions import estimated_from
from specwatch.cost.inputs import load_prices
from specwatch.cost.measured import measured_inputs, read_usage
from specwatch.cost.sharing import Lives, merged_device_s, virtual_time
from specwatch.telemetry.schema import MAX_TAGS, IngestBatch, RequestRecord

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gateway"))
from gateway_harness import GatewayServer  # noqa: E402
from test_device_share import slow_upstream, union_s  # noqa: E402

H100 = "NVIDIA H100 80GB HBM3"


def _close(a: float, b: float, rel: float = 1e-9) -> None:
    assert abs(a - b) <= rel * max(abs(a), abs(b), 1e-12), (a, b)


def _lives(*rows: tuple[str, str, float, float]) -> Lives:
    instance, gateway, start, end = zip(*rows)
    return Lives(np.array(instance, dtype=object), np.array(gateway, dtype=object), np.array(start), np.array(end))


def test_two_gateways_share_by_hand_and_one_gateway_is_left_alone():
    shared = _lives(("up", "a", 0.0, 4.0), ("up", "b", 2.0, 6.0), ("alone", "a", 0.0, 4.0), ("alone", "a", 2.0, 6.0))
    got = merged_device_s(shared, shared.instance, shared.start, shared.end)
    assert got[:2].tolist() == [3.0, 3.0]  # 2 s alone + half of the 2 s together; Σ = 6 s busy, not 8
    assert np.isnan(got[2:]).all()  # one gateway: its own figures stand
    clipped = merged_device_s(shared, shared.instance[:2], np.array([3.0, 3.0]), np.array([4.0, 6.0]))
    assert clipped.tolist() == [0.5, 2.5]  # a window from t = 3: Σ = the 3 s busy inside it


def _brute_force(busy: list[tuple[float, float]], start: float, end: float) -> float:
    """∫ dt / n over [start, end], interval by interval between every boundary (O(n²))."""
    cuts = sorted({start, end, *(t for span in busy for t in span if start < t < end)})
    total = 0.0
    for lo, hi in zip(cuts, cuts[1:]):
        n = sum(1 for s, e in busy if s <= lo and hi <= e and e > s)
        total += (hi - lo) / n if n else 0.0
    return total


def test_the_sweep_matches_a_brute_force_integral_and_adds_up_to_the_busy_time():
    rng = np.random.default_rng(7)
    start = np.round(rng.uniform(0, 50, 60), 1)
    end = start + np.round(rng.exponential(4.0, 60), 1)  # some of length 0
    got = virtual_time(start, end, start, end)
    busy = list(zip(start.tolist(), end.tolist()))
    want = [_brute_force(busy, s, e) for s, e in busy]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    _close(got.sum(), union_s(busy))


def test_a_million_gateway_records_share_in_seconds():
    rng = np.random.default_rng(1)
    n = 1_000_000
    start = np.sort(rng.uniform(T0, T0 + 86_400, n))
    end = start + rng.exponential(2.0, n)
    lives = Lives(np.full(n, "up", dtype=object), np.where(np.arange(n) % 2, "a", "b").astype(object), start, end)
    began = time.perf_counter()
    got = merged_device_s(lives, lives.instance, start, end)
    elapsed = time.perf_counter() - began
    reach = np.concatenate([[-np.inf], np.maximum.accumulate(end)[:-1]])  # starts are sorted
    _close(got.sum(), np.clip(end - np.maximum(start, reach), 0.0, None).sum(), 1e-6)  # the union of the lives
    assert elapsed < 10.0, elapsed  # one sort and two binary searches per record (0.8 s here)


def _ask(url: str, delay_s: float, sleep_s: float) -> None:
    time.sleep(delay_s)
    response = httpx.post(f"{url}/v1/completions", json={"prompt": "x", "sleep": sleep_s}, timeout=30)
    assert response.status_code == 200, response.text


def _serve(plan: list[tuple[GatewayServer, float, float]]) -> list[RequestRecord]:
    """Each (gateway, delay, upstream sleep) asked at once from its own thread; every gateway's records."""
    threads = [threading.Thread(target=_ask, args=(gw.url, delay, sleep)) for gw, delay, sleep in plan]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    gateways = list(dict.fromkeys(gw for gw, _, _ in plan))
    return [r for gw in gateways for r in gw.wait_records(sum(1 for g, _, _ in plan if g is gw))]


def _store(tmp_path, records: list[RequestRecord]):
    """A SQLite store with the records and the upstream's device samples every 0.5 s around them."""
    lives = [(r.started_at + r.queue_s, r.started_at + r.e2e_s) for r in records]
    first, last = min(s for s, _ in lives) - 1.0, max(e for _, e in lives) + 1.0
    at = np.arange(first, last + 0.5, 0.5)
    held = {"device": H100, "mem_reserved_bytes": 80_000_000_000, "power_w": 300.0, "power_source": "nvml"}
    samples = [sample_dict(i, at=float(t), instance="slow", **held) for i, t in enumerate(at)]
    db = make_db(f"sqlite:///{tmp_path / 'sharing.db'}")
    upgrade(db)
    batch = {"requests": [r.model_dump() for r in records], "samples": samples}
    Store(db).insert(IngestBatch.model_validate(batch))
    return db, Window(first - 1.0, last + 1.0), union_s(lives)


def test_two_real_gateways_in_front_of_one_upstream_charge_its_busy_time_once(tmp_path):
    app = slow_upstream()
    with (
        ThreadServer(app) as upstream,
        GatewayServer([f"slow={upstream.url}"], name="edge-a") as a,
        GatewayServer([f"slow={upstream.url}"], name="edge-b") as b,
    ):
        records = _serve([(a, 0.0, 0.5), (b, 0.05, 0.5), (a, 0.1, 0.5), (b, 0.15, 0.5)])
    assert sorted(r.tags["gateway"] for r in records) == ["edge-a", "edge-a", "edge-b", "edge-b"]
    db, window, busy = _store(tmp_path, records)
    own = sum(r.device_s for r in records)
    assert own > 1.5 * busy  # each gateway charged the upstream as if it had it alone
    usage = read_usage(db, window)
    _close(usage.device_s.sum(), busy)  # shared over both gateways' requests: its busy time, once
    assert set(usage.sources.tolist()) == {"gateway_ps_merged"} and usage.derived.all()
    inputs = measured_inputs(db, window, load_prices(), gpu_type="H100-SXM")
    (arm,) = inputs.arms
    assert arm.device_s_source == "gateway_ps_merged"
    (instance,) = inputs.instances
    _close(instance.busy_s, busy)
    assert instance.billed_s == instance.up_s > busy  # the bill is the up-time, no longer the double charge
    found = allocate(inputs)
    _close(found.lines_usd, found.bill_usd)
    _close(found.usd(kind="arm"), busy * 4.5 / 3600)  # on-demand H100-SXM: $4.5 per GPU-hour
    assert all(line.estimate for line in found.lines if line.kind == "arm")  # shown with "~"
    assert any("derived" in note for note in estimated_from(inputs, arm.key))  # and named among the estimates
    db.dispose()


def test_one_real_gateway_keeps_its_own_processor_sharing(tmp_path):
    app = slow_upstream()
    with ThreadServer(app) as upstream, GatewayServer([f"slow={upstream.url}"], name="edge-a") as a:
        records = _serve([(a, 0.0, 0.4), (a, 0.1, 0.4)])
        too_many = {f"k{i}": "v" for i in range(MAX_TAGS)}
        refused = httpx.post(f"{a.url}/v1/completions", json={"prompt": "x", "sleep": 0, "tags": too_many})
    assert refused.status_code == 400 and "at most 15 tags" in refused.text  # the gateway's own tag needs room
    db, window, busy = _store(tmp_path, records)
    usage = read_usage(db, window)
    assert sorted(usage.device_s.tolist()) == sorted(r.device_s for r in records)  # nothing changes
    assert set(usage.sources.tolist()) == {"processor_sharing"} and not usage.derived.any()
    inputs = measured_inputs(db, window, load_prices(), gpu_type="H100-SXM")
    assert inputs.arms[0].device_s_source == "processor_sharing"
    _close(allocate(inputs).lines_usd, allocate(inputs).bill_usd)
    db.dispose()


def _gateway_record(i: int, gateway: str, start: float, end: float, tenant: str) -> dict:
    tags = {"gateway": gateway, "tenant": tenant}
    return plain_request_dict(
        i, instance="up", started_at=start, e2e_s=end - start, device_s=end - start, device_s_source="processor_sharing"
    ) | {"tags": tags}


def test_a_filtered_read_still_shares_with_everyone_in_flight(db):  # SQLite and PostgreSQL
    records = [_gateway_record(1, "a", T0, T0 + 4, "x"), _gateway_record(2, "b", T0 + 2, T0 + 6, "y")]
    Store(db).insert(IngestBatch.model_validate({"requests": records}))
    window = Window(T0, T0 + 10)
    assert sorted(read_usage(db, window).device_s.tolist()) == [3.0, 3.0]
    only_x = read_usage(db, window, Filters(tags=(("tenant", "x"),)))
    assert only_x.device_s.tolist() == [3.0]  # tenant y's request at the other gateway still shares it
    assert sorted(read_usage(db, Window(T0 + 3, T0 + 10)).device_s.tolist()) == [0.5, 2.5]  # clipped
