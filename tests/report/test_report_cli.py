"""`specwatch report`: bad input exits 2 with one line; a good month prints the two paths it wrote."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
from collector_payloads import request_dict

from specwatch.cli import main
from specwatch.collector.db import make_db, upgrade
from specwatch.collector.ingest.store import Store
from specwatch.telemetry.schema import IngestBatch

SOURCE_ROOT = Path(__file__).resolve().parents[2]  # the repository


@pytest.fixture
def db(tmp_path) -> str:
    """A store with 30 requests in May 2026."""
    url = f"sqlite:///{tmp_path / 'store.db'}"
    db = make_db(url)
    upgrade(db)
    start = datetime(2026, 5, 10, tzinfo=UTC).timestamp()
    Store(db).insert(
        IngestBatch.model_validate({"requests": [request_dict(i, started_at=start + 60 * i) for i in range(30)]})
    )
    db.dispose()
    return url


@pytest.mark.parametrize(
    "month, message",
    [
        ("2026-13", "month must be YYYY-MM, got '2026-13'"),
        ("May", "month must be YYYY-MM, got 'May'"),
        ("2999-01", "2999-01 has not begun yet"),
    ],
)
def test_bad_month_exits_2_with_one_line(month, message, db, tmp_path, capsys):
    assert main(["report", "--month", month, "--db", db, "--out", str(tmp_path / "out")]) == 2
    captured = capsys.readouterr()
    assert captured.err == f"specwatch report: error: {message}\n" and captured.out == ""
    assert not (tmp_path / "out").exists()


def test_other_bad_input_exits_2(db, tmp_path, capsys):
    assert main(["report", "--month", "2026-05", "--db", db, "--gpu", "TPU9"]) == 2
    assert capsys.readouterr().err.startswith("specwatch report: error: unknown GPU type 'TPU9'")
    assert main(["report", "--month", "2026-05", "--db", "not a url"]) == 2
    assert capsys.readouterr().err.count("\n") == 1


def test_writes_and_prints_both_paths(db, tmp_path, capsys):
    out = tmp_path / "reports"
    assert main(["report", "--month", "2026-05", "--db", db, "--out", str(out)]) == 0
    printed = capsys.readouterr().out.split()
    assert printed == [str(out / "specwatch-report-2026-05.html"), str(out / "specwatch-report-2026-05.json")]
    assert json.loads((out / "specwatch-report-2026-05.json").read_text())["headline"]["requests"] == 30


def test_console_entry_point(tmp_path):
    """Through `python -m specwatch`, as a person runs it: exit code 2 and one line on stderr."""
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "specwatch", "report", "--month", "2026/05"],
        cwd=SOURCE_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2 and done.stderr == "specwatch report: error: month must be YYYY-MM, got '2026/05'\n"
    assert time.monotonic() - started < 60


def test_without_month_it_reports_this_month_to_date_and_says_so(db, tmp_path, capsys):
    """Issue 55: the first report after `specwatch up` reads what it stored, not an empty last month."""
    month = datetime.now(UTC).strftime("%Y-%m")
    assert main(["report", "--db", db, "--out", str(tmp_path)]) == 0
    captured = capsys.readouterr()
    assert captured.out.split()[0] == str(tmp_path / f"specwatch-report-{month}.html")
    assert captured.err.startswith(f"specwatch report: {month} to date ({month}-01 00:00 to ")
