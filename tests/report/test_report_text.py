"""Producers' strings render as text in the monthly report and the cost workbook (issue 53): an HTML tag
in a drafter is escaped, `$...$` in a plot title is not typeset (a malformed one failed the report), and
an instance named like a formula is a string cell, never a formula Excel would run."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from collector_payloads import plain_request_dict, request_dict, sample_dict
from openpyxl import load_workbook

from specwatch.collector.ingest.store import Store
from specwatch.collector.reads.queries import Window
from specwatch.cost.inputs import load_prices
from specwatch.cost.summary import measured_summary
from specwatch.cost.xlsx import write_workbook
from specwatch.report.build import build_report
from specwatch.report.html import write_report
from specwatch.telemetry.schema import IngestBatch

DRAFTER = "model:<script>alert(1)</script>$\\frac{x}{$"
INSTANCE = '=HYPERLINK("https://evil.example","open")'


def fill(db, start: float) -> None:
    spec = [request_dict(i, instance=INSTANCE, drafter=DRAFTER, started_at=start + 60 * i) for i in range(40)]
    plain = [plain_request_dict(100 + i, instance=INSTANCE, started_at=start + 60 * i + 30) for i in range(40)]
    samples = [sample_dict(i, instance=INSTANCE, at=start + 60 * i) for i in range(10)]
    Store(db).insert(IngestBatch.model_validate({"requests": spec + plain, "samples": samples}))


def test_the_report_renders_producer_strings_as_text(db, tmp_path):
    now = time.time()
    month = datetime.fromtimestamp(now, UTC).strftime("%Y-%m")
    fill(db, datetime.fromtimestamp(now, UTC).replace(day=1, hour=0, minute=0).timestamp() + 60)
    html_path, _ = write_report(build_report(db, month, load_prices(), now=now), tmp_path)
    html = html_path.read_text()
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_the_workbook_keeps_a_formula_like_instance_a_string(db, tmp_path):
    now = time.time()
    fill(db, now - 3600)
    summary = measured_summary(db, Window(now - 7200, now), load_prices())
    path = tmp_path / "cost.xlsx"
    write_workbook(summary.inputs, path)
    cells = [c for sheet in load_workbook(path) for row in sheet.iter_rows() for c in row if c.value == INSTANCE]
    assert cells and all(c.data_type == "s" for c in cells)
