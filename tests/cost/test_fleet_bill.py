"""A bill per instance (issue 52): each instance priced on its own device, a device declared dedicated.

The store: an H100 and an L4 instance, each sampled every minute for 2 h (yesterday from 01:00 UTC: one
UTC day, well inside the raw retention), vLLM-style reserved memory below the device's, a few plain and
speculative requests on each. By hand, on demand: 2 h x $4.50 + 2 h x $0.80 = $10.60 (the audit's fleet
billed as two H100s: $18.00).
"""

from __future__ import annotations

import csv
import json
import math
import time

import pytest
from collector_payloads import plain_request_dict, request_dict, sample_dict
from focus_validator import failed_rules, needs_validator
from openpyxl import load_workbook

from specwatch.cli import main
from specwatch.collector.ingest.store import Store
from specwatch.collector.reads.queries import Window
from specwatch.cost.focus import measured_focus
from specwatch.cost.inputs import Overrides, load_fleet, load_prices
from specwatch.cost.summary import measured_summary, render_text
from specwatch.cost.xlsx import MODEL_ROW, fleet_ref, fleet_rows, write_workbook
from specwatch.telemetry.schema import IngestBatch

DEVICES = {"gpu-h100": ("NVIDIA H100 80GB HBM3", 72e9), "gpu-l4": ("NVIDIA L4", 20e9)}  # reserved < device
HOURS = 2.0
BY_HAND = HOURS * 4.50 + HOURS * 0.80  # 10.60


def _start() -> float:
    """01:00 UTC yesterday: the two hours fall in one UTC day, well inside the raw retention."""
    return math.floor(time.time() / 86400) * 86400 - 86400 + 3600


def _batch(start: float) -> dict:
    requests, samples = [], []
    for n, (instance, (device, reserved)) in enumerate(DEVICES.items()):
        at = {"instance": instance, "device_s_source": "engine", "device_s": 1.0, "e2e_s": 2.0}
        for i in range(6):
            requests.append(request_dict(100 * n + i, started_at=start + 600 * i + 30, **at))
            requests.append(plain_request_dict(100 * n + 50 + i, started_at=start + 600 * i + 300, **at))
        extra = {"instance": instance, "device": device, "mem_reserved_bytes": reserved}
        samples += [sample_dict(k, at=start + 60 * k, **extra) for k in range(1, int(HOURS * 60) + 1)]
    return {"requests": requests, "samples": samples}


@pytest.fixture
def fleet_db(db):
    start = _start()
    Store(db).insert(IngestBatch.model_validate(_batch(start)))
    return db, Window(start - 3600, start + HOURS * 3600 + 600)


def _fleet(tmp_path, text: str):
    path = tmp_path / "fleet.toml"
    path.write_text(text)
    return path


def _close(a: float, b: float, rel: float = 1e-9) -> None:
    assert abs(a - b) <= rel * max(abs(a), abs(b)), (a, b)


def test_each_instance_is_billed_at_its_own_device_price(fleet_db):
    db, window = fleet_db
    summary = measured_summary(db, window, load_prices())
    allocation = summary.tco.allocation
    bills = {b.instance: b for b in allocation.bills}
    header = render_text(summary).splitlines()[2]  # after the verdict: the devices priced, each its own
    assert "gpu-h100 1x H100-SXM at $4.50/GPU-hour (on-demand)" in header and "gpu-l4 1x L4 at $0.80" in header
    assert {name: (b.gpu_type, b.gpu_hour_usd, b.source) for name, b in bills.items()} == {
        "gpu-h100": ("H100-SXM", 4.50, "device samples"),
        "gpu-l4": ("L4", 0.80, "device samples"),
    }
    assert [b.billed_s for b in bills.values()] == [HOURS * 3600] * 2
    _close(allocation.bill_usd, BY_HAND)  # the goal is 1%; by hand it is exact
    _close(allocation.lines_usd, allocation.bill_usd)
    assert not any(b.estimate for b in bills.values())


def test_focus_rows_are_priced_on_their_instance_device(fleet_db):
    db, window = fleet_db
    rows = measured_focus(db, window, load_prices(), gpu_type="H100-SXM")
    _close(sum(r["ListCost"] for r in rows), BY_HAND)
    _close(sum(r["BilledCost"] for r in rows), BY_HAND)
    assert {(r["ResourceId"], r["SkuId"], r["SkuPriceId"], r["ListUnitPrice"]) for r in rows} == {
        ("gpu-h100", "H100-SXM", "H100-SXM:on-demand", 4.50),
        ("gpu-l4", "L4", "L4:on-demand", 0.80),
    }
    for row in rows:
        _close(row["ListCost"], row["ListUnitPrice"] * row["PricingQuantity"])


def test_a_dedicated_device_has_no_other_tenants(fleet_db, tmp_path):
    db, window = fleet_db
    prices = load_prices()
    fleet = load_fleet(_fleet(tmp_path, '[gpu-h100]\ngpu_type = "H100-SXM"\ndedicated = true\n'), prices)
    allocation = measured_summary(db, window, prices, overrides=Overrides(fleet=fleet)).tco.allocation
    others = {line.instance for line in allocation.lines if line.kind == "other_tenants"}
    assert others == {"gpu-l4"}  # reserved 20 of 24 GB, not declared: the rest is other tenants
    shares = {b.instance: (b.share, b.share_source) for b in allocation.bills}
    assert shares["gpu-h100"] == (1.0, "dedicated (fleet file)")
    assert shares["gpu-l4"][0] == pytest.approx(20 / 24)
    undeclared = measured_summary(db, window, prices).tco.allocation
    assert {x.instance for x in undeclared.lines if x.kind == "other_tenants"} == {"gpu-h100", "gpu-l4"}


def test_fleet_file_sets_gpu_count_pricing_and_price(fleet_db, tmp_path):
    db, window = fleet_db
    prices = load_prices()
    text = (
        '[gpu-h100]\ngpu_type = "H100-SXM"\ngpu_count = 2\npricing = "reserved"\ncommitment = "h100-1y"\n'
        'gpu_hour_usd = 2.80\n\n[gpu-l4]\ngpu_type = "L4"\npricing = "spot"\n'
    )
    fleet = load_fleet(_fleet(tmp_path, text), prices)
    summary = measured_summary(db, window, prices, overrides=Overrides(fleet=fleet))
    bills = {b.instance: b for b in summary.tco.allocation.bills}
    assert (bills["gpu-h100"].gpu_count, bills["gpu-h100"].pricing, bills["gpu-h100"].source) == (
        2,
        "reserved",
        "fleet file",
    )
    _close(summary.tco.allocation.bill_usd, HOURS * 2 * 2.80 + HOURS * 0.35)
    rows = measured_focus(db, window, prices, gpu_type="H100-SXM", overrides=Overrides(fleet=fleet))
    committed = {r["CommitmentDiscountId"] for r in rows if r["PricingCategory"] == "Committed"}
    assert committed == {"h100-1y"} and {r["PricingCategory"] for r in rows} == {"Committed", "Dynamic"}
    assert sum(r["BilledCost"] for r in rows) == pytest.approx(summary.tco.allocation.bill_usd, rel=1e-9)


@needs_validator
def test_a_mixed_committed_fleet_passes_focus_validator(fleet_db, db_url, tmp_path):
    """Two GPU types, one reserved under a commitment and one spot, through `specwatch cost --focus`."""
    text = '[gpu-h100]\ngpu_type = "H100-SXM"\npricing = "reserved"\ncommitment = "h100-1y"\n\n'
    text += '[gpu-l4]\ngpu_type = "L4"\npricing = "spot"\n'
    out, last = tmp_path / "focus.csv", str(int(time.time() - fleet_db[1].start))
    assert (
        main(["cost", "--db", db_url, "--last", last, "--fleet", str(_fleet(tmp_path, text)), "--focus", str(out)]) == 0
    )
    assert failed_rules(out) == set()


def test_tco_and_xlsx_follow_each_instance_price(fleet_db, tmp_path):
    from pycel import ExcelCompiler

    db, window = fleet_db
    summary = measured_summary(db, window, load_prices())
    inputs, costs = summary.inputs, summary.tco
    for arm in costs.arms:  # an arm's window $ are its lines at each instance's rate
        _close(arm.window_usd, costs.allocation.usd(arm=arm.key))
    for mode in ("autoregressive", "speculative"):  # the concurrency table's $ are the same lines
        usd = sum(r.usd_per_mtok * r.output_tokens / 1e6 for r in summary.concurrency.rows if r.mode == mode)
        _close(usd, sum(costs.allocation.usd(arm=a.key) for a in costs.arms if a.mode == mode), 1e-6)
    path = tmp_path / "fleet.xlsx"
    write_workbook(inputs, path)
    book, last = ExcelCompiler(filename=str(path)), load_workbook(path)["Lines"].max_row
    _close(book.evaluate(f"Lines!G{last - 1}"), BY_HAND)  # Σ bills
    for column, arm in zip("BC", sorted(costs.arms, key=lambda a: a.mode != "autoregressive")):
        for label in ("gpu_hours_per_mtok", "compute_usd_per_mtok", "total_usd_per_mtok"):
            assert book.evaluate(f"Model!{column}{MODEL_ROW[label]}") == pytest.approx(getattr(arm, label)), label
    l4_price = fleet_ref(fleet_rows(costs.allocation)["gpu-l4"], "gpu_hour_usd")
    assert book.evaluate(l4_price) == 0.80
    book.set_value(l4_price, 1.80)  # finance edits the L4's price: its bill follows, the H100's does not
    _close(book.evaluate(f"Lines!G{last - 1}"), BY_HAND + HOURS * 1.0)
    assert abs(book.evaluate(f"Lines!G{last}")) <= 1e-9 * BY_HAND


def test_an_unnamed_instance_is_priced_as_the_global_gpu_and_marked(fleet_db):
    db, window = fleet_db
    extra = {"instance": "gpu-x", "device_s_source": "engine", "device_s": 4.0, "e2e_s": 5.0}
    record = plain_request_dict(900, started_at=window.start + 3700, **extra)
    Store(db).insert(IngestBatch.model_validate({"requests": [record]}))
    summary = measured_summary(db, window, load_prices())
    bill = next(b for b in summary.tco.allocation.bills if b.instance == "gpu-x")
    assert bill.estimate and bill.source.startswith("estimate") and bill.gpu_type == summary.inputs.gpu_type
    assert any("gpu-x priced as" in note for note in summary.notes)


@pytest.mark.parametrize(
    "text, message",
    [
        ('[gpu-a]\ngpu_type = "B300"\n', "gpu-a: unknown GPU type 'B300'"),
        ('[gpu-a]\ngpu_type = "L4"\ngpu_count = -1\n', "gpu-a: gpu_count"),
        ('[gpu-a]\ngpu_type = "L4"\npricing = "monthly"\n', "gpu-a: pricing"),
        ('[gpu-a]\ngpu_type = "L4"\ngpu_hour_usd = -2\n', "gpu-a: gpu_hour_usd"),
        ('[gpu-a]\ngpu_type = "L4"\ncommitment = "x"\n', "commitment goes with pricing = 'reserved'"),
        ('gpu-a = "L4"\n', "gpu-a: expected a table"),
        ("", "no instance in the fleet file"),
    ],
)
def test_a_bad_fleet_file_is_a_clear_value_error(tmp_path, text, message):
    path = _fleet(tmp_path, text)
    with pytest.raises(ValueError, match=message.replace("(", r"\(")) as found:
        load_fleet(path, load_prices())
    assert str(found.value).startswith(str(path))


def test_cli_fleet_errors_exit_2_and_gpu_still_prices_every_instance(fleet_db, db_url, tmp_path, capsys):
    bad = _fleet(tmp_path, '[gpu-a]\ngpu_type = "B300"\n')
    assert main(["cost", "--db", db_url, "--fleet", str(bad)]) == 2
    assert "unknown GPU type 'B300'" in capsys.readouterr().err
    last = str(3 * 86400)
    assert main(["cost", "--db", db_url, "--last", last, "--json"]) == 0
    bills = json.loads(capsys.readouterr().out)["tco"]["allocation"]["bills"]
    _close(sum(b["compute_usd"] for b in bills), BY_HAND)
    focus = tmp_path / "focus.csv"
    argv = ["cost", "--db", db_url, "--last", last, "--gpu", "H100-SXM", "--json", "--focus", str(focus)]
    assert main(argv) == 0
    bills = json.loads(capsys.readouterr().out)["tco"]["allocation"]["bills"]
    assert {(b["gpu_type"], b["source"]) for b in bills} == {("H100-SXM", "given")}
    _close(sum(b["compute_usd"] for b in bills), 2 * HOURS * 4.50)  # the audit's $18.00
    with open(focus) as handle:
        rows = list(csv.DictReader(handle))
    assert {r["SkuId"] for r in rows} == {"H100-SXM"}
    _close(sum(float(r["ListCost"]) for r in rows), 2 * HOURS * 4.50)


def test_the_daily_cost_series_prices_each_instance_on_its_own_gpu(fleet_db):
    """/v1/cost/daily and the $/1M gauge read the same per-instance bill: a mixed fleet is not priced as
    the GPU most sampled (which would make the L4's hours H100 hours)."""
    from specwatch.service.cost_gauges import arm_costs

    db, window = fleet_db
    prices = load_prices()
    summary = measured_summary(db, window, prices)
    by_summary = {arm.key: arm.total_usd_per_mtok for arm in summary.tco.arms}
    by_gauge = {arm.key: arm.total_usd_per_mtok for arm, _, _ in arm_costs(db, window, prices, "H100-SXM")}
    assert by_gauge == pytest.approx(by_summary, rel=1e-9)
    as_one_gpu = measured_summary(db, window, prices, gpu_type="H100-SXM")
    assert as_one_gpu.tco.allocation.bill_usd > 1.5 * summary.tco.allocation.bill_usd  # what it was
