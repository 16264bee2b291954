"""`specwatch up --once`: collector + engine + sample traffic end to end, telemetry stored."""

from __future__ import annotations

import os
import socket
import sqlite3
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_up_once_stores_the_sample_traffic(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, "-m", "specwatch", "up", "--once", "--requests", "3", "--max-tokens", "16",
           "--port", str(free_port()), "--data-dir", str(tmp_path)]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "collector, last hour: 3 requests" in done.stdout
    with sqlite3.connect(tmp_path / "specwatch.db") as db:
        modes = dict(db.execute("select mode, count(*) from requests group by mode").fetchall())
        events = db.execute("select kind from engine_events").fetchall()
    assert modes == {"speculative": 2, "autoregressive": 1}
    assert events == [("cold_start",)]


def test_up_rejects_bad_arguments():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "specwatch", "up", "--port", "0"], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 2 and "--port" in done.stderr
