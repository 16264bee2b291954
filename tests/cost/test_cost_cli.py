"""`specwatch cost` (text, --json, --xlsx, exit codes) and GET /v1/cost."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import pytest
from collector_payloads import T0, plain_request_dict, request_dict, sample_dict
from openpyxl import load_workbook

from specwatch.cli import main
from specwatch.collector.db import make_db, upgrade
from specwatch.collector.ingest.store import Store
from specwatch.cost.breakeven import break_even_alpha
from specwatch.cost.inputs import load_prices, what_if_inputs
from specwatch.cost.model import IdleTime, tco
from specwatch.cost.xlsx import ARM_ROWS, BENEFIT_ROWS, IDLE_ROW, MODEL_ROW, input_ref, write_workbook
from specwatch.telemetry.schema import IngestBatch

EXAMPLE = Path(__file__).parents[2] / "cost" / "cost_example.toml"


def evaluate(book, sheet: str, cell: str):
    """A cell's value with its formula evaluated by a formula engine (pycel)."""
    return book.evaluate(f"{sheet}!{cell}")


def compiled(path: Path):
    from pycel import ExcelCompiler

    return ExcelCompiler(filename=str(path))


def _fill(url: str, start: float | None) -> None:
    """A migrated store; with `start`, 40 speculative and 40 plain requests from then on (plain 2x slower)."""
    db = make_db(url)
    upgrade(db)
    if start is None:
        return db.dispose()
    records = [
        request_dict(i, started_at=start + i, e2e_s=1.0, draft_s=0.01, verify_s=0.5, tags={"scenario": "grounded"})
        for i in range(40)
    ]
    records += [
        # 3 s apart: one plain request at a time, so each is charged its whole life
        plain_request_dict(100 + i, started_at=start + 100 + 3 * i, e2e_s=2.0, tags={"scenario": "grounded"})
        for i in range(40)
    ]
    samples = [sample_dict(i, at=start + 5 * i, active_requests=1) for i in range(10)]
    Store(db).insert(IngestBatch.model_validate({"requests": records, "samples": samples}))
    db.dispose()


def test_what_if_text_and_json(capsys):
    assert main(["cost", "--what-if", str(EXAMPLE)]) == 0
    out = capsys.readouterr().out
    assert (
        "H100-SXM at $4.50/GPU-hour (on-demand), prices as of 2026-11" in out and "speculative:model:llama-68m" in out
    )
    assert "draft training 1,250" in out and "energy is an estimate" in out
    assert main(["cost", "--what-if", str(EXAMPLE), "--json", "--gpu", "H200", "--volume", "1e9"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert set(got) == {
        "source",
        "window",
        "inputs",
        "tco",
        "break_even",
        "sensitivity",
        "advice",
        "notes",
        "concurrency",
        "verdict",
    }
    assert got["verdict"]["sentence"].startswith("Speculation (") and got["verdict"]["arm"] == got["tco"]["primary"]
    assert (
        got["source"] == "what-if" and got["tco"]["gpu_type"] == "H200" and got["tco"]["monthly_output_tokens"] == 1e9
    )
    expected = tco(replace(what_if_inputs(EXAMPLE, load_prices(), "H200"), monthly_output_tokens=1e9))
    assert got["tco"]["benefits"][0]["net_usd"] == pytest.approx(expected.benefits[0].net_usd)
    row = got["break_even"][0]
    v = row["verify_cost_ratio"]
    assert v == pytest.approx((14000 / 520_000) / (49750 / 1_990_000)) and row["source"] == "the window's totals"
    assert row["speedup_alpha"] == pytest.approx(break_even_alpha(row["gamma"], row["draft_cost_ratio"], v))
    assert len(row["curve"]) == 21 and row["curve"][-1][0] == 1.0
    assert got["sensitivity"][0]["swing"] >= got["sensitivity"][-1]["swing"]


def test_xlsx_formulas_recompute_the_model(tmp_path, capsys):
    path = tmp_path / "cost.xlsx"
    assert main(["cost", "--what-if", str(EXAMPLE), "--xlsx", str(path)]) == 0
    assert f"wrote {path}" in capsys.readouterr().out
    book = load_workbook(path)
    assert book.sheetnames == ["Inputs", "Lines", "Model", "Concurrency", "Break-even", "Assumptions"]
    model = book["Model"]
    formulas = [c.value for row in model.iter_rows(min_row=2, min_col=2) for c in row if c.value is not None]
    assert formulas and all(f.startswith("=") for f in formulas)
    assert all(
        "Inputs!" in f
        for f in (model[f"B{MODEL_ROW[label]}"].value for label in ("gpu_hours_per_mtok", "memory_share"))
    )
    gpu_count = input_ref("gpu_count", "B")  # the arm's GPUs, live over the fleet table's ($B$4 here)
    assert model[f"B{MODEL_ROW['gpu_hours_per_mtok']}"].value.startswith(f"={gpu_count}*1000000/Inputs!B")
    assert "$C$" in book["Inputs"][gpu_count.split("!")[1]].value
    book = compiled(path)
    # by hand: 1 GPU x 1e6 tokens / 40 tok/s / 3600 s/h
    assert evaluate(book, "Model", f"B{MODEL_ROW['gpu_hours_per_mtok']}") == pytest.approx(1e6 / 40 / 3600)
    expected = tco(what_if_inputs(EXAMPLE, load_prices()))
    for column, arm in zip("BC", expected.arms):
        for label in ARM_ROWS:
            assert evaluate(book, "Model", f"{column}{MODEL_ROW[label]}") == pytest.approx(
                getattr(arm, label) or 0.0
            ), label
    benefit = expected.benefits[0]
    spec = {label: evaluate(book, "Model", f"C{MODEL_ROW[label]}") for label in BENEFIT_ROWS}
    assert spec["net_benefit_usd_month"] == pytest.approx(benefit.net_usd)
    assert spec["hidden_usd_month"] == pytest.approx(benefit.hidden.total_usd)
    assert spec["payback_months"] == (benefit.payback_months or "never")
    assert model[f"B{MODEL_ROW['net_benefit_usd_month']}"].value is None  # no benefit row for plain decoding
    sheets = load_workbook(path)
    assert sheets["Assumptions"]["A1"].value == "input"
    assert sheets["Assumptions"].max_row == len(expected.assumptions) + 1
    # finance edits a price: the formulas follow, and the lines still add up to the bill
    book.set_value("Inputs!B3", 9.0)
    assert evaluate(book, "Model", f"B{MODEL_ROW['compute_usd_per_mtok']}") == pytest.approx(
        1e6 / 40 / 3600 * 9.0 * 0.25
    )
    last = sheets["Lines"].max_row
    assert abs(evaluate(book, "Lines", f"G{last}")) < 1e-9 * evaluate(book, "Lines", f"G{last - 1}")


def test_measured_window(tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'cost.db'}"
    _fill(url, start=None)
    assert main(["cost", "--db", url]) == 0  # an empty store prices nothing, and says so
    out = capsys.readouterr().out
    assert "No requests to price" in out and "gpu_type H100-SXM assumed" in out
    _fill(url, time.time() - 3600)
    assert main(["cost", "--db", url, "--last", "86400", "--gpu", "L4"]) == 0
    out = capsys.readouterr().out
    assert "last 1.0 days measured" in out and "speculative:ngram" in out and "Enable speculation for grounded: " in out
    assert main(["cost", "--db", url, "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["source"] == "measured" and got["tco"]["gpu_type"] == "cpu-laptop"  # the sampled device is "cpu"
    assert got["inputs"]["hidden"]["sources"]["monitoring_gb_per_day"] == "measured"
    assert got["advice"][0]["evidence"]["speedup"] == pytest.approx(2.0)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--what-if", "missing.toml"], "cannot read missing.toml"),
        (["--what-if", str(EXAMPLE), "--gpu", "B200"], "unknown GPU type 'B200'"),
        (["--what-if", str(EXAMPLE), "--prices", "missing-prices.toml"], "cannot read missing-prices.toml"),
        (["--db", "sqlite:///{tmp}/empty.db"], "run `specwatch db upgrade` first"),
        (["--db", "postgresql+psycopg://nobody@127.0.0.1:1/none"], "cannot read the database"),
        (["--db", "not a url"], "not a database URL"),
    ],
)
def test_bad_input_exits_2_with_one_line(argv, message, tmp_path, capsys):
    assert main(["cost", *(a.replace("{tmp}", str(tmp_path)) for a in argv)]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1 and err.startswith("specwatch cost: error: ")


def test_bad_what_if_value_and_bad_option(tmp_path, capsys):
    bad = tmp_path / "bad.toml"
    bad.write_text('[prices]\npue = 0.5\n[[arms]]\nmode = "autoregressive"\ntokens_per_s = 10\n')
    assert main(["cost", "--what-if", str(bad)]) == 2
    assert "prices.pue: Input should be greater than or equal to 1" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main(["cost", "--last", "-5"])
    assert exited.value.code == 2
    with pytest.raises(SystemExit):
        main(["cost", "--last", "60", "--what-if", str(EXAMPLE)])  # one source of inputs


def test_cost_endpoint(client):
    records = [request_dict(i, e2e_s=1.0, draft_s=0.01, verify_s=0.5, tags={"scenario": "grounded"}) for i in range(40)]
    records += [  # one at a time: each plain request is charged its whole life
        plain_request_dict(100 + i, started_at=T0 + 100 + 3 * i, e2e_s=2.0, tags={"scenario": "grounded"})
        for i in range(40)
    ]
    samples = [sample_dict(i, active_requests=1, device="NVIDIA H100 80GB HBM3") for i in range(10)]
    assert client.post("/v1/ingest", json={"requests": records, "samples": samples}).status_code == 200
    window = {"start": T0 - 1, "end": T0 + 1000}
    got = client.get("/v1/cost", params=window).json()
    assert got["tco"]["gpu_type"] == "H100-SXM" and got["tco"]["gpu_hour_usd"] == 4.5
    assert [a["key"] for a in got["tco"]["arms"]] == ["autoregressive", "speculative:ngram"]
    assert got["break_even"][0]["measured_speedup"] == pytest.approx(2.0)
    assert got["advice"][0]["scenario"] == "grounded" and got["sensitivity"]
    edited = client.get(
        "/v1/cost",
        params={
            **window,
            "gpu": "L4",
            "gpu_hour_usd": 2.0,
            "pue": 1.1,
            "monthly_output_tokens": 1e9,
            "draft_training_usd": 0,
            "amortisation_months": 6,
            "incident_days_per_week": 0.5,
            "tech_debt_buffer": 0.1,
        },
    ).json()
    assert edited["tco"]["gpu_type"] == "L4" and edited["tco"]["gpu_hour_usd"] == 2.0
    assert edited["tco"]["monthly_output_tokens"] == 1e9 and edited["inputs"]["prices"]["pue"] == 1.1
    hidden = edited["tco"]["benefits"][0]["hidden"]
    assert hidden["incidents_usd"] == pytest.approx(0.5 * 52 / 12 * 800)
    spot = client.get("/v1/cost", params={**window, "pricing": "spot", "amortisation_months": 3}).json()
    assert spot["tco"]["pricing"] == "spot" and spot["inputs"]["hidden"]["amortisation_months"] == 3
    assert spot["inputs"]["hidden"]["sources"]["amortisation_months"] == "given"
    for params, message in (
        ({"pricing": "free"}, "Input should be 'on-demand', 'spot', 'reserved' or 'on-prem'"),
        ({"pue": 0.5}, "greater than or equal to 1"),
        ({"tech_debt_buffer": -1}, "greater than"),
        ({"gpu_type": "B200"}, "unknown GPU type"),
        ({"gpu": "L4", "gpu_type": "H200"}, "disagree"),
        ({"last": 0}, "greater than 0"),
        ({"monthly_output_tokens": "lots"}, "valid number"),
    ):
        bad = client.get("/v1/cost", params={**window, **params})
        assert bad.status_code == 422 and message in bad.text, params


XLSX_CASES = {
    "on-demand, memory measured": {},
    "on-prem: energy added": {"pricing": "on-prem"},
    "0 bytes measured": {"zero_memory": True},
    "memory not measured": {"no_memory": True},
    "idle spread by share": {"idle": IdleTime(86_400.0, 20_000.0, 3.6e6), "idle_allocation": "by_share"},
    "idle its own line, on-prem": {"idle": IdleTime(86_400.0, 20_000.0, 3.6e6), "pricing": "on-prem"},
    "untrained drafter, seed hidden costs": {"drafter": "suffix"},
    "failed work": {"failed": True},
}


@pytest.mark.parametrize("case", list(XLSX_CASES))
def test_xlsx_matches_python_on_every_case(case, tmp_path):
    """The workbook's formulas give the model's figures, cell for cell, on each case of the table."""
    options = dict(XLSX_CASES[case])
    inputs = what_if_inputs(EXAMPLE, load_prices())
    arms = list(inputs.arms)
    if options.pop("zero_memory", False):
        arms = [replace(a, target_memory_bytes=0.0, draft_memory_bytes=0.0) for a in arms]
    if options.pop("no_memory", False):
        arms = [replace(a, target_memory_bytes=None, memory_source="unmeasured") for a in arms]
    if drafter := options.pop("drafter", None):
        arms = [replace(a, drafter=drafter) if a.mode == "speculative" else a for a in arms]
    if options.pop("failed", False):
        arms = [replace(a, device_s=1000.0, failed_device_s=50.0 * (i + 1)) for i, a in enumerate(arms)]
    inputs = replace(inputs, arms=tuple(arms), **options)
    path = tmp_path / "case.xlsx"
    write_workbook(inputs, path)
    book = compiled(path)
    expected = tco(inputs)
    for column, arm in zip("BC", expected.arms):
        for label in ARM_ROWS:
            got = evaluate(book, "Model", f"{column}{MODEL_ROW[label]}")
            assert got == pytest.approx(getattr(arm, label) or 0.0), (case, arm.key, label)
    spec = {label: evaluate(book, "Model", f"C{MODEL_ROW[label]}") for label in BENEFIT_ROWS}
    (benefit,) = expected.benefits
    assert spec["net_benefit_usd_month"] == pytest.approx(benefit.net_usd), case
    assert spec["hidden_usd_month"] == pytest.approx(benefit.hidden.total_usd), case
    payback = spec["payback_months"]
    assert (payback == "never") if benefit.payback_months is None else payback == pytest.approx(benefit.payback_months)
    idle = evaluate(book, "Model", f"B{MODEL_ROW[IDLE_ROW]}")
    assert idle == pytest.approx(expected.idle.monthly_usd if expected.idle else 0.0), case


def test_pricing_hidden_costs_file_and_incidents_from_alerts(tmp_path, capsys):
    hidden = tmp_path / "hidden.toml"
    hidden.write_text("[hidden]\nincident_days_per_week = 0.5\nopportunity_days_per_month = 2\n")
    assert main(["cost", "--what-if", str(EXAMPLE), "--pricing", "spot", "--hidden-costs", str(hidden), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["tco"]["pricing"] == "spot" and got["tco"]["gpu_hour_usd"] == 2.5
    table = {row["name"]: row for row in got["tco"]["assumptions"]}
    assert table["incident_days_per_week"]["value"] == 0.5 and table["incident_days_per_week"]["source"] == "given"
    assert table["training_data_fraction"]["source"] == "default (seed)"  # not in the what-if file
    assert got["tco"]["benefits"][0]["hidden"]["opportunity_usd"] == 1600.0
    assert main(["cost", "--what-if", str(EXAMPLE), "--hidden-costs", str(hidden)]) == 0
    out = capsys.readouterr().out
    assert "Assumptions (input, value, source):" in out and "net benefit ~" in out  # seed defaults remain
    hidden.write_text("[hidden]\ntech_debt_buffer = -1\n")
    assert main(["cost", "--what-if", str(EXAMPLE), "--hidden-costs", str(hidden)]) == 2
    err = capsys.readouterr().err
    assert "tech_debt_buffer: Input should be greater than or equal to 0" in err and err.count("\n") == 1
    url = f"sqlite:///{tmp_path / 'cost.db'}"
    _fill(url, time.time() - 3600)
    assert main(["cost", "--db", url, "--incidents", "alerts", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["inputs"]["hidden"]["incident_days_per_week"] == 0.0  # no alert fired in the window
    assert got["inputs"]["hidden"]["sources"]["incident_days_per_week"] == "measured (alert history)"
    assert got["concurrency"]["rows"] and got["concurrency"]["crossover"] is None
    hidden.write_text("monitoring_gb_per_day = 3\n")  # a value the user gives wins over the store's growth
    assert main(["cost", "--db", url, "--hidden-costs", str(hidden), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)["inputs"]["hidden"]
    assert got["monitoring_gb_per_day"] == 3 and got["sources"]["monitoring_gb_per_day"] == "given"
