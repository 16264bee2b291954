"""Cost model v3 (issue 25): the bill reconciles everywhere, and the audit's cases.

A hand-built store (two instances, one at half its memory, idle time, failures, a speculative failure
retried plainly, speculative and plain requests batched together, records without device time, a
window that cuts requests at both ends): Σ every line = the bill to 1e-9 relative in the API, the
CLI's JSON, the report's data, the xlsx (evaluated by pycel) and the FOCUS export.
"""

from __future__ import annotations

import csv
import json
from dataclasses import replace
from pathlib import Path

import pytest
from collector_payloads import T0, plain_request_dict, request_dict, sample_dict
from focus_validator import failed_rules, needs_validator
from openpyxl import load_workbook

from specwatch.cli import main
from specwatch.collector.db import make_db, upgrade
from specwatch.collector.ingest.store import Store
from specwatch.collector.reads.queries import Window
from specwatch.cost.allocation import allocate
from specwatch.cost.breakeven import break_even_alpha, expected_speedup, speedup_from_times
from specwatch.cost.concurrency import ConcurrencyRow, crossing
from specwatch.cost.inputs import load_prices
from specwatch.cost.measured import measured_inputs
from specwatch.cost.model import CostInputs, HiddenCosts, ModeMeasure, tco
from specwatch.cost.summary import measured_summary
from specwatch.telemetry.schema import IngestBatch

H100 = "NVIDIA H100 80GB HBM3"
WINDOW = {"start": T0, "end": T0 + 150}
REPO = Path(__file__).resolve().parents[2]


def _records() -> list[dict]:
    a = {"instance": "gpu-a", "device_s_source": "engine"}  # device time recorded by the engine
    spec, plain = request_dict, plain_request_dict
    records = []
    for i in range(12):  # gpu-a: speculative and plain side by side (mixed batches)
        records.append(spec(i, started_at=T0 + 10 * i, e2e_s=6.0, device_s=1.5, draft_s=0.2, verify_s=2.0, **a))
        records.append(plain(100 + i, started_at=T0 + 10 * i + 1, e2e_s=6.0, device_s=1.0, verify_s=3.0, **a))
    records.append(spec(50, started_at=T0 + 3, e2e_s=2.0, device_s=0.5, status="error", output_tokens=0, **a))
    records.append(spec(51, started_at=T0 + 5, e2e_s=4.0, device_s=2.0, retries=1, **a))  # retried plainly
    records.append(spec(52, started_at=T0 - 15, e2e_s=40.0, device_s=8.0, **a))  # cut: 25 of its 40 s inside
    records.append(plain(53, started_at=T0 + 140, e2e_s=20.0, device_s=4.0, **a))  # cut at the end
    for i in range(8):  # gpu-b: no device time recorded: derived by processor sharing
        records.append(plain(200 + i, started_at=T0 + 15 * i, e2e_s=8.0, instance="gpu-b"))
    return records


def _samples() -> list[dict]:
    half = {"mem_reserved_bytes": 40_000_000_000, "device": H100, "power_w": 300.0, "power_source": "nvml"}
    whole = {**half, "mem_reserved_bytes": 80_000_000_000, "instance": "gpu-b"}
    samples = [sample_dict(i, at=T0 + 10 * i, instance="gpu-a", **half) for i in range(16)]
    return samples + [sample_dict(i, at=T0 + 10 * i, **whole) for i in range(16)]


@pytest.fixture
def store_url(tmp_path) -> str:
    url = f"sqlite:///{tmp_path / 'v3.db'}"
    db = make_db(url)
    upgrade(db)
    Store(db).insert(IngestBatch.model_validate({"requests": _records(), "samples": _samples()}))
    db.dispose()
    return url


def _close(a: float, b: float) -> None:
    assert abs(a - b) <= 1e-9 * max(abs(a), abs(b), 1e-12), (a, b)


def _sums(allocation: dict) -> tuple[float, float]:
    lines = sum(x["compute_usd"] + x["energy_usd"] for x in allocation["lines"])
    bills = sum(b["compute_usd"] + b["energy_usd"] for b in allocation["bills"])
    return lines, bills


def test_reconciles_in_the_model_api_cli_report_xlsx_and_focus(store_url, tmp_path, capsys):
    from pycel import ExcelCompiler

    db = make_db(store_url)
    window = Window(**WINDOW)
    prices = load_prices()
    for allocation in ("separate", "weighted", "even"):
        inputs = measured_inputs(db, window, prices, gpu_type="H100-SXM", idle_allocation=allocation)
        found = allocate(inputs)
        _close(found.lines_usd, found.bill_usd)
        gpu_hours = sum(b.billed_s for b in found.bills) / 3600
        _close(found.bill_usd, gpu_hours * 4.5)  # on-demand: the bill is GPU-hours x price
        assert {line.kind for line in found.lines} >= {"arm", "retries", "other_tenants"}
    shares = {i.name: i.share for i in inputs.instances}
    assert shares == {"gpu-a": 0.5, "gpu-b": 1.0}
    report = measured_summary(db, window, prices)  # what report.build prices its month with
    _close(report.tco.allocation.lines_usd, report.tco.allocation.bill_usd)
    db.dispose()
    xlsx, focus = tmp_path / "v3.xlsx", tmp_path / "v3.csv"
    argv = ["cost", "--db", store_url, "--last", "150", "--json", "--xlsx", str(xlsx), "--focus", str(focus)]
    import time as clock

    real = clock.time
    clock.time = lambda: T0 + 150  # the CLI measures the last 150 s: the window above
    try:
        assert main(argv) == 0
    finally:
        clock.time = real
    got = json.loads(capsys.readouterr().out)
    lines, bills = _sums(got["tco"]["allocation"])
    _close(lines, bills)
    _close(bills, report.tco.allocation.bill_usd)
    book = ExcelCompiler(filename=str(xlsx))
    last = load_workbook(xlsx)["Lines"].max_row
    _close(book.evaluate(f"Lines!G{last - 2}"), bills)  # Σ lines
    assert abs(book.evaluate(f"Lines!G{last}")) <= 1e-9 * bills  # Σ lines - Σ bills
    with open(focus) as handle:
        billed = sum(float(row["BilledCost"]) for row in csv.DictReader(handle))
    _close(billed, bills)


def test_api_lines_add_up_and_focus_csv(client):
    assert client.post("/v1/ingest", json={"requests": _records(), "samples": _samples()}).status_code == 200
    got = client.get("/v1/cost", params={**WINDOW, "idle_allocation": "even"}).json()
    lines, bills = _sums(got["tco"]["allocation"])
    _close(lines, bills)
    focus = client.get("/v1/cost/focus", params=WINDOW)
    assert focus.status_code == 200 and focus.headers["content-type"].startswith("text/csv")
    rows = list(csv.DictReader(focus.text.splitlines()))
    _close(sum(float(r["BilledCost"]) for r in rows), bills)
    assert {json.loads(r["Tags"])["x_specwatch_line"] for r in rows} >= {"arm", "idle", "other_tenants", "retries"}
    bad = client.get("/v1/cost/focus", params={**WINDOW, "idle_allocation": "sometimes"})
    assert bad.status_code == 422


def test_window_edges_failures_and_retries(store_url):
    db = make_db(store_url)
    inputs = measured_inputs(db, Window(**WINDOW), load_prices(), gpu_type="H100-SXM")
    db.dispose()
    arms = {arm.key: arm for arm in inputs.arms}
    spec, plain = arms["speculative:ngram"], arms["autoregressive"]
    # the speculative failure (0.5 s) and the first attempt of the retried request (half of its 2 s)
    assert spec.failed_device_s == pytest.approx(0.5 + 1.0)
    assert spec.retries == 1 and plain.retries == 0
    # the straddling request: 25 of its 40 s inside, so 25/40 of its 8 device-seconds
    assert spec.device_s == pytest.approx(12 * 1.5 + 1.0 + 8.0 * 25 / 40)
    uses = {(i.name, u.arm): u for i in inputs.instances for u in i.arms}
    assert uses[("gpu-b", "autoregressive")].derived and not uses[("gpu-a", "autoregressive")].derived
    assert tco(inputs).arms[0].estimate  # plain decoding's device time is partly derived: "~"


def _arm(mode: str, tokens_per_s: float, **more) -> ModeMeasure:
    drafter = "ngram" if mode == "speculative" else None
    return ModeMeasure(mode, drafter, 1000, 1_000_000, 86_400.0, tokens_per_s, **more)


def test_a_free_drafter_18_percent_faster_is_not_a_loss():
    zero = dict(monitoring_gb_per_day=0.0, incident_days_per_week=0.0)
    hidden = HiddenCosts().with_values("given", **zero)
    inputs = CostInputs(
        (_arm("autoregressive", 100.0), _arm("speculative", 118.0)), load_prices(), "H100-SXM", hidden=hidden
    )
    (benefit,) = tco(inputs).benefits
    assert benefit.explicit_saving_usd > 0 and benefit.hidden.tech_debt_usd == 0.0
    assert (
        benefit.net_usd == pytest.approx(benefit.explicit_saving_usd) == pytest.approx(benefit.net_without_reserve_usd)
    )
    old = replace(inputs, hidden=replace(hidden, reserve_base="deployment"))
    (taxed,) = tco(old).benefits
    assert taxed.net_usd < 0 < taxed.net_without_reserve_usd  # the older reading turned it into a loss


def test_break_even_in_one_unit():
    assert break_even_alpha(4, 0.2, 1.5) == pytest.approx(0.686, abs=5e-4)
    # the same from times: t_plain 1, t_verify 1.5, t_draft = c x t_verify
    for alpha in (0.3, 0.686, 0.9):
        assert speedup_from_times(alpha, 4, 1.0, 1.5, 0.3) == pytest.approx(expected_speedup(alpha, 4, 0.2, 1.5))


def test_break_even_without_plain_arm_says_not_measured():
    from specwatch.cost.breakeven import break_even

    spec = _arm("speculative", 118.0, drafts=100, draft_tokens=400, accepted_tokens=200, draft_s=4.0, verify_s=10.0)
    (found,) = break_even(CostInputs((spec,), load_prices(), "H100-SXM"))
    assert found.verify_cost_ratio is None and found.speedup_alpha is None and not found.curve
    assert any("not measured" in w for w in found.warnings)


def _row(level: int, mode: str, usd: float, enough: bool = True) -> ConcurrencyRow:
    return ConcurrencyRow(level, mode, 10.0 if enough else 1.0, 1e4, 1.0, 1.0, usd, None, enough)


def test_one_request_cannot_set_a_crossover():
    rows = (
        _row(1, "speculative", 1.0),
        _row(1, "autoregressive", 2.0),
        _row(8, "speculative", 3.0, enough=False),
        _row(8, "autoregressive", 1.0),
    )
    assert crossing(rows).level is None
    assert crossing(rows[:2] + (_row(8, "speculative", 3.0), rows[3])).level == 8


def test_concurrency_levels_need_enough_requests(store_url):
    db = make_db(store_url)
    summary = measured_summary(db, Window(**WINDOW), load_prices())
    db.dispose()
    rows = summary.concurrency.rows
    assert rows and all(r.enough == (r.requests >= 5 and r.output_tokens >= 200) for r in rows)
    assert all(r.usd_low <= r.usd_per_mtok <= r.usd_high for r in rows if r.enough and r.usd_low is not None)


@needs_validator
def test_focus_export_passes_focus_validator(store_url, tmp_path):
    out = tmp_path / "focus.csv"
    import time as clock

    real = clock.time
    clock.time = lambda: T0 + 150
    try:
        assert main(["cost", "--db", store_url, "--last", "150", "--focus", str(out)]) == 0
    finally:
        clock.time = real
    assert failed_rules(out) == set()


def test_excess_ratio_is_the_alerts_cost_formula():
    from specwatch.cost.signals import excess_ratio

    assert excess_ratio(11.0, 100, 10.0, 100) == pytest.approx(0.1)
    assert excess_ratio(1.0, 0, 1.0, 1) is None and excess_ratio(1.0, 1, 0.0, 1) is None
