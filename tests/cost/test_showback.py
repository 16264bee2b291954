"""Showback that sums to the bill (issue 52): a tenant's view is its own work plus its share of idle by
device time (OpenCost's rule), never the other tenants' work; all tenants plus the requests of no tenant
plus the other tenants' memory share add up to the fleet bill.

The store: an H100 and an L4 instance sampled every minute for 2 h, vLLM-style reserved memory (72 of
80 GB, 20 of 24 GB: a share below 1), requests of three tenants and some with no tenant on both, some
failed and retried, and an idle hour with no request. Every figure is checked against arithmetic by hand.
"""

from __future__ import annotations

import csv
import json
import math
import time

import pytest
from collector_payloads import plain_request_dict, request_dict, sample_dict
from focus_validator import failed_rules, needs_validator

from specwatch.cli import main
from specwatch.collector.ingest.store import Store
from specwatch.collector.reads.queries import Filters, Window
from specwatch.cost.inputs import load_prices
from specwatch.cost.summary import measured_summary
from specwatch.telemetry.schema import IngestBatch

HOURS = 2.0
# instance -> (device name, reserved bytes, $/GPU-hour on demand, device bytes by the price table)
DEVICES = {"gpu-h100": ("NVIDIA H100 80GB HBM3", 72e9, 4.50), "gpu-l4": ("NVIDIA L4", 20e9, 0.80)}
TENANTS = ("acme", "globex", "initech", None)  # None: a request that names no tenant
DEVICE_S = {"acme": 3.0, "globex": 1.5, "initech": 0.5, None: 2.0}  # per request
CHARGED = ("arm", "retries", "idle")  # a view's own lines


def _start() -> float:
    return math.floor(time.time() / 86400) * 86400 - 86400 + 3600  # 01:00 UTC yesterday


def _requests(start: float, n: int, instance: str) -> list[dict]:
    found = []
    for i in range(40):  # the first hour only: the second one is idle
        tenant = TENANTS[i % 4]
        make = request_dict if i % 3 else plain_request_dict
        fields = {"instance": instance, "started_at": start + 60 + 80 * i, "device_s_source": "engine"}
        fields |= {"device_s": DEVICE_S[tenant], "e2e_s": 4.0, "tags": {"tenant": tenant} if tenant else {}}
        if i % 7 == 3:
            fields |= {"status": "error", "error": "target:oom", "output_tokens": 0}
        elif i % 5 == 2:
            fields |= {"retries": 1}
        found.append(make(1000 * n + i, **fields))
    return found


@pytest.fixture
def fleet(db):
    start, batch = _start(), {"requests": [], "samples": []}
    for n, (instance, (device, reserved, _)) in enumerate(DEVICES.items()):
        batch["requests"] += _requests(start, n, instance)
        extra = {"instance": instance, "device": device, "mem_reserved_bytes": reserved}
        batch["samples"] += [sample_dict(k, at=start + 60 * k, **extra) for k in range(1, int(HOURS * 60) + 1)]
    Store(db).insert(IngestBatch.model_validate(batch))
    return db, Window(start, start + HOURS * 3600 + 60), batch["requests"]


def _by_hand(requests: list[dict], tenant: str | None, instance: str, share: float) -> float:
    """The tenant's work on the instance plus its part of idle, by device time, at the instance's rate."""
    rate = DEVICES[instance][2] / 3600
    mine = sum(r["device_s"] for r in requests if r["instance"] == instance and r["tags"].get("tenant") == tenant)
    everyone = sum(r["device_s"] for r in requests if r["instance"] == instance)
    idle = HOURS * 3600 - everyone
    return share * rate * (mine + idle * mine / everyone)


def test_tenant_views_and_the_requests_of_no_tenant_add_up_to_the_fleet_bill(fleet):
    db, window, requests = fleet
    prices = load_prices()
    whole = measured_summary(db, window, prices).tco.allocation
    shares = {b.instance: b.share for b in whole.bills}
    assert 0 < min(shares.values()) < 1  # vLLM's reserved memory below the device: other tenants exist
    assert whole.bill_usd == pytest.approx(sum(HOURS * d[2] for d in DEVICES.values()), rel=1e-9)
    allocated = {}
    for tenant in TENANTS[:3]:
        view = measured_summary(db, window, prices, filters=Filters(tags=(("tenant", tenant),))).tco.allocation
        assert view.bill_usd == pytest.approx(whole.bill_usd, rel=1e-12)  # the view's lines add up to the bill
        assert view.lines_usd == pytest.approx(view.bill_usd, rel=1e-12)
        by_hand = sum(_by_hand(requests, tenant, name, shares[name]) for name in DEVICES)
        assert view.allocated_usd == pytest.approx(by_hand, rel=1e-9)  # not the others' work as its idle
        allocated[tenant] = view.allocated_usd
    no_tenant = sum(_by_hand(requests, None, name, shares[name]) for name in DEVICES)
    other_tenants = whole.usd(kind="other_tenants")
    assert sum(allocated.values()) + no_tenant + other_tenants == pytest.approx(whole.bill_usd, rel=1e-9)
    assert allocated["acme"] > allocated["globex"] > allocated["initech"]  # 3 : 1.5 : 0.5 of the work


def test_a_view_keeps_what_lies_outside_it_on_its_own_line(fleet):
    db, window, _ = fleet
    view = measured_summary(db, window, load_prices(), filters=Filters(tags=(("tenant", "initech"),)))
    kinds = {line.kind for line in view.tco.allocation.lines}
    assert {"arm", "idle", "outside_view", "other_tenants"} <= kinds
    idle = view.tco.allocation.usd(kind="idle")
    outside = view.tco.allocation.usd(kind="outside_view")
    assert outside > 10 * idle  # most of the fleet's work and idle belongs to others


def test_the_cli_focus_and_xlsx_tenant_views_add_up_to_the_bill(fleet, db_url, tmp_path, capsys):
    """`specwatch cost --tag tenant=T --json`, its FOCUS rows (tagged with the tenant on its own lines) and its
    xlsx (lines charged to the tenant, $ evaluated from the formulas by pycel): the tenants' charges plus the
    requests of no tenant plus other tenants' memory = the fleet bill."""
    from pycel import ExcelCompiler

    db, window, requests = fleet
    last = str(int(time.time() - window.start))
    charged, focus_charged, xlsx_charged = {}, {}, {}
    for tenant in TENANTS[:3]:
        out, book = tmp_path / f"{tenant}.csv", tmp_path / f"{tenant}.xlsx"
        view = ["--tag", f"tenant={tenant}", "--json", "--focus", str(out), "--xlsx", str(book)]
        assert main(["cost", "--db", db_url, "--last", last, *view]) == 0
        lines = json.loads(capsys.readouterr().out)["tco"]["allocation"]["lines"]
        charged[tenant] = sum(x["compute_usd"] + x["energy_usd"] for x in lines if x["kind"] in CHARGED)
        rows = list(csv.DictReader(out.open()))
        mine = [r for r in rows if json.loads(r["Tags"]).get("x_specwatch_tag_tenant") == tenant]
        focus_charged[tenant] = sum(float(r["BilledCost"]) for r in mine)
        assert {json.loads(r["Tags"])["x_specwatch_line"] for r in mine} <= set(CHARGED)
        sheet = ExcelCompiler(filename=str(book))
        at = range(2, 2 + len(lines))
        assert [sheet.evaluate(f"Lines!B{n}") for n in at] == [x["kind"] for x in lines]
        xlsx_charged[tenant] = sum(
            sheet.evaluate(f"Lines!G{n}") for n in at if sheet.evaluate(f"Lines!K{n}") == f"tenant={tenant}"
        )
    assert focus_charged == pytest.approx(charged, rel=1e-9)
    assert xlsx_charged == pytest.approx(charged, rel=1e-9)
    whole = measured_summary(db, Window(window.start, time.time()), load_prices()).tco.allocation
    shares = {b.instance: b.share for b in whole.bills}
    no_tenant = sum(_by_hand(requests, None, name, shares[name]) for name in DEVICES)
    total = sum(charged.values()) + no_tenant + whole.usd(kind="other_tenants")
    assert total == pytest.approx(whole.bill_usd, rel=1e-6)


@needs_validator
def test_a_tenant_focus_export_passes_focus_validator(fleet, db_url, tmp_path):
    _, window, _ = fleet
    out, last = tmp_path / "acme.csv", str(int(time.time() - window.start))
    assert main(["cost", "--db", db_url, "--last", last, "--tag", "tenant=acme", "--focus", str(out)]) == 0
    assert failed_rules(out) == set()


@pytest.mark.parametrize("tag", ["tenant", "=acme", "tenant="])
def test_a_malformed_tag_is_a_usage_error(tag, capsys):
    with pytest.raises(SystemExit) as exited:
        main(["cost", "--last", "60", "--tag", tag])
    assert exited.value.code == 2 and "argument --tag" in capsys.readouterr().err
