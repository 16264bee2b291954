"""`specwatch up --once`: collector + engine + dashboard + sample traffic end to end, telemetry stored."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import yaml

from specwatch.common import free_port, specwatch_command

REPO = Path(__file__).resolve().parents[1]


def test_up_once_stores_the_sample_traffic(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    ports = [str(free_port()) for _ in range(3)]
    cmd = specwatch_command("up", "--once", "--requests", "3", "--max-tokens", "16", "--data-dir", str(tmp_path))
    cmd += ["--port", ports[0], "--engine-port", ports[1], "--dashboard-port", ports[2]]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "collector, last 60 min: 3 requests" in done.stdout
    assert f"dashboard  http://127.0.0.1:{ports[2]}" in done.stdout
    with sqlite3.connect(tmp_path / "specwatch.db") as db:
        rows = db.execute("select arm, drafter, json_extract(tags, '$.scenario') from requests").fetchall()
        events = {kind for (kind,) in db.execute("select kind from engine_events")}
    assert len(rows) == 3 and {(arm, drafter) for arm, drafter, _ in rows} <= {("spec", "ngram"), ("control", None)}
    assert {scenario for *_, scenario in rows} <= {"grounded", "code-edit"}
    assert {"cold_start", "config"} <= events
    rules = yaml.safe_load((tmp_path / "alert-rules.yaml").read_text())
    assert rules["remediation"]["engines"] == {"*": f"http://127.0.0.1:{ports[1]}"}
    ttft = next(rule for rule in rules["rules"] if rule["name"] == "TTFTP99High")
    assert ttft["threshold"] == 1.0 and "TTFTP99High threshold raised from 0.3 s to 1 s" in done.stdout


def test_up_rejects_bad_arguments():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "specwatch", "up", "--port", "0"], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 2 and "--port" in done.stderr
