"""The verdict issue's audit as one hand-built store (issue 52, "What it must show").

Two GPU types at different prices (an H100 and an L4 instance, sampled every minute for 2 h, vLLM-style
reserved memory below the device's), three tenants and requests of no tenant, bursts of 1, 2, 4, 8 and 16
requests served together in both modes (each request's device_s its share of the burst's busy time),
failures and retried requests, an idle stretch, and a window that starts and ends inside requests.

On it: the fleet bill = Σ instance price x hours in the window (within 1%); every tenant's view plus the
requests of no tenant plus the other tenants' memory share = the fleet bill (within 1%); the concurrency
table reaches level 16 and each drafter on each GPU type has its own crossover.
"""

from __future__ import annotations

import math
import time

import pytest
from collector_payloads import plain_request_dict, request_dict, sample_dict

from specwatch.collector.ingest.store import Store
from specwatch.collector.reads.queries import Filters, Window
from specwatch.cost.inputs import load_prices
from specwatch.cost.summary import measured_summary
from specwatch.telemetry.schema import IngestBatch

HOURS = 2.0
DEVICES = {"gpu-h100": ("NVIDIA H100 80GB HBM3", 72e9, 4.50), "gpu-l4": ("NVIDIA L4", 20e9, 0.80)}
TENANTS = ("acme", "globex", "initech", None)
LEVELS = (1, 2, 4, 8, 16)
BURST_S = 20.0  # each burst's requests run together this long


def _start() -> float:
    return math.floor(time.time() / 86400) * 86400 - 86400 + 3600  # 01:00 UTC yesterday


def _bursts(start: float, n: int, instance: str) -> list[dict]:
    """Per level and mode, 3 bursts of `level` requests; every 7th fails, every 5th was retried."""
    found, at, i = [], start + 120.0, 0
    for level in LEVELS:
        for make in (request_dict, plain_request_dict) * 3:
            for _ in range(level):
                tenant = TENANTS[i % 4]
                fields = {"instance": instance, "started_at": at, "e2e_s": BURST_S, "device_s_source": "engine"}
                fields |= {"device_s": 0.9 * BURST_S / level, "tags": {"tenant": tenant} if tenant else {}}
                if i % 7 == 3:
                    fields |= {"status": "error", "error": "target:oom", "output_tokens": 0}
                elif i % 5 == 2:
                    fields |= {"retries": 1}
                found.append(make(10_000 * n + i, **fields))
                i += 1
            at += BURST_S + 10.0
    return found  # ~15 min of bursts, then idle to the end of the 2 h


@pytest.fixture
def audit(db):
    start, batch = _start(), {"requests": [], "samples": []}
    for n, (instance, (device, reserved, _)) in enumerate(DEVICES.items()):
        batch["requests"] += _bursts(start, n, instance)
        extra = {"instance": instance, "device": device, "mem_reserved_bytes": reserved}
        batch["samples"] += [sample_dict(k, at=start + 60 * k, **extra) for k in range(1, int(HOURS * 60) + 1)]
    Store(db).insert(IngestBatch.model_validate(batch))
    # from inside the first burst (120 s + 8 s) to a minute before the last sample
    return db, Window(start + 128.0, start + HOURS * 3600 - 60), batch["requests"]


def _inside(r: dict, window: Window) -> float:
    """The part of a request's life inside the window."""
    start, end = r["started_at"], r["started_at"] + r["e2e_s"]
    return max(min(end, window.end) - max(start, window.start), 0.0) / (end - start)


def _by_hand(requests: list[dict], tenant: str | None, window: Window, shares: dict[str, float]) -> float:
    """OpenCost's rule by hand: on each instance, the tenant's device time plus its part of idle by device
    time, at the instance's price, times its memory share."""
    total = 0.0
    for name, (_, _, price) in DEVICES.items():
        on = [r for r in requests if r["instance"] == name]
        mine = sum(r["device_s"] * _inside(r, window) for r in on if r["tags"].get("tenant") == tenant)
        everyone = sum(r["device_s"] * _inside(r, window) for r in on)
        idle = (window.end - window.start) - everyone
        total += shares[name] * price / 3600 * (mine + idle * mine / everyone)
    return total


def test_the_fleet_bill_is_each_instance_price_times_its_hours_in_the_window(audit):
    db, window, _ = audit
    summary = measured_summary(db, window, load_prices())
    hours = (window.end - window.start) / 3600
    by_hand = sum(price * hours for _, _, price in DEVICES.values())
    assert summary.tco.allocation.bill_usd == pytest.approx(by_hand, rel=0.01)
    assert {b.instance: b.usd_per_s * 3600 for b in summary.tco.allocation.bills} == pytest.approx(
        {name: price for name, (_, _, price) in DEVICES.items()}
    )


def test_every_tenant_view_plus_the_unallocated_is_the_fleet_bill(audit):
    db, window, requests = audit
    prices = load_prices()
    whole = measured_summary(db, window, prices).tco.allocation
    shares = {b.instance: b.share for b in whole.bills}
    assert 0 < min(shares.values()) < 1  # reserved memory below the device: other tenants exist
    tenants = {}
    for tenant in TENANTS[:3]:
        view = measured_summary(db, window, prices, filters=Filters(tags=(("tenant", tenant),))).tco.allocation
        tenants[tenant] = view.allocated_usd
        assert view.allocated_usd == pytest.approx(_by_hand(requests, tenant, window, shares), rel=0.01)
    no_tenant = _by_hand(requests, None, window, shares)
    assert sum(tenants.values()) + no_tenant + whole.usd(kind="other_tenants") == pytest.approx(
        whole.bill_usd, rel=0.01
    )


def test_the_concurrency_table_reaches_16_and_each_group_has_its_crossover(audit):
    db, window, _ = audit
    concurrency = measured_summary(db, window, load_prices()).concurrency
    assert {row.level for row in concurrency.rows} >= {1, 2, 4, 8, 16}
    groups = {(g.gpu_type, g.drafter) for g in concurrency.groups}
    assert len(groups) == 2 and {gpu for gpu, _ in groups} == {"H100-SXM", "L4"}
    assert all(g.crossover.reason for g in concurrency.groups)
