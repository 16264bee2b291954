"""The report's cost section follows cost model v2: over a store whose requests carry device time and
overlap at two concurrency levels, the HTML shows every assumption with its source (seed defaults and
estimates marked), the idle line, the pricing, the cost-vs-concurrency plot with its crossover, the
measured verify-cost ratio, and a net benefit marked "~" with the estimates it rests on; the JSON
carries the same. `--hidden-costs` (CLI and the schedule's setting) changes the hidden costs, shown as
"given"; a bad file exits 2 with one line."""

from __future__ import annotations

import base64
import json
import re
from dataclasses import replace
from datetime import UTC, datetime
from html import escape, unescape

import pytest
from collector_payloads import plain_request_dict, request_dict, sample_dict
from report_checks import check_html

from specwatch.cli import main
from specwatch.collector.db import make_db, upgrade
from specwatch.collector.ingest.store import Store
from specwatch.collector.settings import Settings
from specwatch.cost.inputs import load_prices
from specwatch.report.build import build_report
from specwatch.report.html import render_html, write_report
from specwatch.report.schedule import run_once
from specwatch.telemetry.schema import IngestBatch

JUNE = datetime(2026, 6, 2, tzinfo=UTC).timestamp()
AFTER_JUNE = datetime(2026, 7, 1, 3, tzinfo=UTC).timestamp()
# device seconds per request (64 output tokens each): alone (level 1) and four at once (level 4).
# Speculation is cheaper alone and dearer at level 4, so the crossover is level 4.
DEVICE_S = {"speculative": (0.4, 0.5), "autoregressive": (0.8, 0.3)}


def _request(i: int, mode: str, start: float, e2e_s: float, device_s: float) -> dict:
    make = request_dict if mode == "speculative" else plain_request_dict
    return make(
        i,
        started_at=start,
        e2e_s=e2e_s,
        device_s=device_s,
        device_s_source="engine",
        draft_s=0.02 if mode == "speculative" else 0.0,
        verify_s=0.8 * device_s,
    )


def concurrency_records() -> list[dict]:
    """Per mode: 8 requests one after another (level 1), then 3 groups of 4 in flight together (level 4)."""
    records: list[dict] = []
    for offset, (mode, (alone, shared)) in zip((0.0, 100.0), DEVICE_S.items()):
        for i in range(8):
            records.append(_request(len(records), mode, JUNE + offset + 10 * i, 1.0, alone))
        for group in range(3):
            for _ in range(4):
                records.append(_request(len(records), mode, JUNE + offset + 200 + 10 * group, 2.0, shared))
    return records


def fill(db) -> None:
    samples = [sample_dict(i, at=JUNE + 10 * i) for i in range(45)]  # 450 s up: most of it idle
    Store(db).insert(IngestBatch.model_validate({"requests": concurrency_records(), "samples": samples}))


@pytest.fixture
def filled(db):
    fill(db)
    return db


@pytest.fixture
def db_file(tmp_path) -> str:
    url = f"sqlite:///{tmp_path / 'store.db'}"
    db = make_db(url)
    upgrade(db)
    fill(db)
    db.dispose()
    return url


def _cells(fragment: str) -> list[tuple[str, ...]]:
    """The body rows of the first table in `fragment`, each cell as its text."""
    body = re.search(r"<tbody>(.*?)</tbody>", fragment, re.S)[1]
    rows = re.findall(r"<tr>(.*?)</tr>", body, re.S)
    return [
        tuple(unescape(re.sub(r"<[^>]+>", "", c)) for c in re.findall(r"<td[^>]*>(.*?)</td>", r, re.S)) for r in rows
    ]


def _div(html: str, anchor: str) -> str:
    found = re.search(rf'<div id="{anchor}">(.*?)</div>', html, re.S)
    assert found, f"no #{anchor} in the report"
    return found[1]


def _value(value) -> str:
    return f"{value:,.6g}" if isinstance(value, (int, float)) else str(value)


def test_cost_section_shows_assumptions_concurrency_and_estimates(filled, tmp_path):
    report = build_report(filled, "2026-06", load_prices(), now=AFTER_JUNE)
    costs, tco = report.cost.concurrency, report.cost.tco
    assert [(r.level, r.mode) for r in costs.rows] == [
        (1, "autoregressive"),
        (1, "speculative"),
        (4, "autoregressive"),
        (4, "speculative"),
    ]
    assert costs.crossover == 4
    html_path, json_path = write_report(report, tmp_path)
    html = html_path.read_text()
    images = check_html(html)
    assert "Every figure is read from" not in html

    # every input of the model, with its value, unit and source; seed defaults marked
    table = _div(html, "assumptions")
    assert _cells(table) == [(a.name, _value(a.value), a.unit, a.source) for a in tco.assumptions]
    seeds = [a.name for a in tco.assumptions if a.source == "default (seed)"]
    assert "incident_days_per_week" in seeds and table.count('class="assumed"') == len(seeds) + 1  # + the legend
    assert "measured (engine)" in table and "price table 2026-11" in table

    # pricing, the idle line, device-time GPU-hours, energy shown "in the price" (on-demand pricing)
    assert f"${tco.gpu_hour_usd:.2f}/GPU-hour, on-demand pricing" in html
    assert re.search(r'<p class="idle">Idle device time: 9\d\.\d% of the 450 s', html)
    # the bill and its lines: they add up (cost.allocation), and the table says so
    allocation = report.cost.tco.allocation
    assert abs(allocation.lines_usd - allocation.bill_usd) <= 1e-9 * allocation.bill_usd
    assert '<div id="bill">' in html and "Σ lines" in html
    assert "GPU-hours (device time)" in html and html.count('class="in-price"') == len(tco.arms)

    # cost against concurrency: the rows, the crossover, and a plot that draws both modes and marks it
    block = _div(html, "concurrency")
    (group,) = costs.groups
    assert f"{group.drafter} on {group.gpu_type}: speculation costs more per token from level 4" in block
    assert [row[:3] for row in _cells(block)] == [(str(r.level), r.mode, str(r.requests)) for r in costs.rows]
    (uri,) = re.findall(r'<img src="data:image/svg\+xml;base64,([^"]+)" alt="USD per 1M output tokens', block)
    svg = base64.b64decode(uri).decode()
    assert svg.encode() in images and "crossover: level 4" in svg and "autoregressive" in svg

    # break-even states the measured verify-cost ratio that its curve uses
    (even,) = report.cost.break_even
    assert even.verify_cost_ratio is not None
    assert f"Verify cost ratio v = {even.verify_cost_ratio:.2f}x a plain step, measured" in html

    # the net benefit rests on seed defaults: "~" wherever it appears, and a footnote naming them
    head = report.headline
    assert head.net_benefit_estimated_from and head.net_benefit_estimated_from == tco.benefits[0].estimated_from
    # the recommendation rests on the measured saving; the verdict marks the assumed fixed costs as estimates
    assert "measured saving" in report.recommendation.reason and "net benefit" not in report.recommendation.reason
    judged = report.cost.verdict
    assert judged.fixed_estimate and "(estimate)" in judged.sentence and escape(judged.sentence) in html
    net = f"~{'-' if head.net_monthly_benefit_usd < 0 else ''}${abs(head.net_monthly_benefit_usd):,.0f}"
    assert ("net benefit (USD/month)", net) in _cells(html[html.index('id="changes"') :])
    assert html.count(", ".join(head.net_benefit_estimated_from)) >= 2  # headline and cost section footnotes

    data = json.loads(json_path.read_text())
    assert [a["name"] for a in data["cost"]["tco"]["assumptions"]] == [a.name for a in tco.assumptions]
    assert data["cost"]["concurrency"]["crossover"] == 4 and len(data["cost"]["concurrency"]["rows"]) == 4
    assert data["headline"]["net_benefit_estimated_from"] == list(head.net_benefit_estimated_from)


def test_no_concurrency_data_says_so(filled):
    report = build_report(filled, "2026-06", load_prices(), now=AFTER_JUNE)
    html = render_html(replace(report, cost=replace(report.cost, concurrency=None)))
    block = _div(html, "concurrency")
    assert "No concurrency data" in block and "<img" not in block


def test_hidden_costs_file_changes_the_report(db_file, tmp_path, capsys):
    hidden = tmp_path / "hidden.toml"
    hidden.write_text("[hidden]\nincident_days_per_week = 0.5\nopportunity_days_per_month = 1\n")
    base = ["report", "--month", "2026-06", "--db", db_file]
    assert main([*base, "--out", str(tmp_path / "default")]) == 0
    assert main([*base, "--out", str(tmp_path / "given"), "--hidden-costs", str(hidden)]) == 0
    capsys.readouterr()
    default, given = (
        json.loads((tmp_path / out / "specwatch-report-2026-06.json").read_text()) for out in ("default", "given")
    )
    rows = {a["name"]: a for a in given["cost"]["tco"]["assumptions"]}
    assert (rows["incident_days_per_week"]["value"], rows["incident_days_per_week"]["source"]) == (0.5, "given")
    assert rows["opportunity_days_per_month"]["source"] == "given"
    assert rows["tech_debt_buffer"]["source"] == "default (seed)"
    before, after = (d["cost"]["tco"]["benefits"][0]["hidden"] for d in (default, given))
    assert after["incidents_usd"] == pytest.approx(before["incidents_usd"] / 4) and after["incidents_source"] == "given"
    assert before["opportunity_usd"] == 0 and after["opportunity_usd"] == 800.0
    assert "incident_days_per_week (seed default)" not in given["headline"]["net_benefit_estimated_from"]
    table = _div((tmp_path / "given" / "specwatch-report-2026-06.html").read_text(), "assumptions")
    assert ("incident_days_per_week", "0.5", "person-days / week", "given") in _cells(table)
    spot = ["--out", str(tmp_path / "spot"), "--pricing", "spot", "--idle-allocation", "by_share"]
    assert main([*base, *spot]) == 0
    capsys.readouterr()
    tco = json.loads((tmp_path / "spot" / "specwatch-report-2026-06.json").read_text())["cost"]["tco"]
    assert tco["pricing"] == "spot" and tco["idle"]["allocation"] == "by_share"


@pytest.mark.parametrize(
    "content, message",
    [
        (
            "[hidden]\ntech_debt_buffer = -1\n",
            "hidden.toml: tech_debt_buffer: Input should be greater than or equal to 0",
        ),
        ("[hidden]\nincidents = 1\n", "hidden.toml: incidents: Extra inputs are not permitted"),
        ("[hidden\n", "hidden.toml: not valid TOML"),
        ("training_data_fraction = 0\n", "training_data_fraction: Input should be greater than 0"),
        (None, "cannot read"),
    ],
)
def test_bad_hidden_costs_file_exits_2_with_one_line(content, message, db_file, tmp_path, capsys):
    hidden = tmp_path / "hidden.toml"
    if content is not None:
        hidden.write_text(content)
    out = tmp_path / "out"
    args = ["report", "--month", "2026-06", "--db", db_file, "--out", str(out), "--hidden-costs", str(hidden)]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("specwatch report: error: ") and message in err and err.count("\n") == 1
    assert not out.exists()


def test_the_schedule_takes_the_hidden_costs_setting(filled, tmp_path):
    hidden = tmp_path / "hidden.toml"
    hidden.write_text("tech_debt_buffer = 0.1\n")
    settings = Settings(data_dir=tmp_path, report_dir=tmp_path / "reports", report_hidden_costs=hidden)
    written = run_once(filled, settings, None, now=AFTER_JUNE)
    data = json.loads(written.with_suffix(".json").read_text())
    rows = {a["name"]: a for a in data["cost"]["tco"]["assumptions"]}
    assert (rows["tech_debt_buffer"]["value"], rows["tech_debt_buffer"]["source"]) == (0.1, "given")


def test_collector_serve_refuses_a_bad_hidden_costs_setting(db_file, tmp_path, monkeypatch, capsys):
    hidden = tmp_path / "hidden.toml"
    hidden.write_text("amortisation_months = 0\n")
    monkeypatch.setenv("SPECWATCH_REPORT_HIDDEN_COSTS", str(hidden))
    assert main(["collector", "serve", "--db", db_file, "--no-alerts"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("specwatch collector: error: SPECWATCH_REPORT_HIDDEN_COSTS: ")
    assert "amortisation_months: Input should be greater than 0" in err and err.count("\n") == 1
