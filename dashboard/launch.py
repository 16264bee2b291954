"""Starting the Streamlit dashboard as a child process (`specwatch dashboard`, `specwatch up`, tests)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx

APP = Path(__file__).resolve().parent / "app.py"


class DashboardStartError(RuntimeError):
    pass


def command(port: int, host: str = "127.0.0.1") -> list[str]:
    return [sys.executable, "-m", "streamlit", "run", str(APP), "--server.port", str(port), "--server.address", host,
            "--server.headless", "true", "--browser.gatherUsageStats", "false", "--server.fileWatcherType", "none"]


def start_dashboard(port: int, collector_url: str, log: Path, timeout_s: float = 60.0) -> subprocess.Popen:
    """Streamlit on 127.0.0.1:`port` reading `collector_url`; returns once its health check answers."""
    env = {**os.environ, "SPECWATCH_COLLECTOR_URL": collector_url}
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        process = subprocess.Popen(command(port), env=env, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise DashboardStartError(f"the dashboard exited with code {process.returncode}; see {log} (is port {port} free?)")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/_stcore/health", timeout=1).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    process.kill()
    raise DashboardStartError(f"the dashboard did not answer on port {port} within {timeout_s:.0f} s; see {log}")
