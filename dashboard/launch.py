"""Starting the Streamlit dashboard as a child process (`specwatch dashboard`, `specwatch up`, tests)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from specwatch.common.procs import child_env, start_service

APP = Path(__file__).resolve().parent / "app.py"


def command(port: int, host: str = "127.0.0.1") -> list[str]:
    return [
        sys.executable,
        "-m",
        "streamlit",
        "run",
        str(APP),
        "--server.port",
        str(port),
        "--server.address",
        host,
        "--server.headless",
        "true",
        "--browser.gatherUsageStats",
        "false",
        "--server.fileWatcherType",
        "none",
    ]


def start_dashboard(
    port: int, collector_url: str, log: Path, timeout_s: float = 60.0, tokens: dict[str, str] | None = None
) -> subprocess.Popen:
    """Streamlit on 127.0.0.1:`port` reading `collector_url`; returns once its health check answers.
    `tokens`: environment variables of the collector's tokens (SPECWATCH_READ_TOKEN, ...).
    Raises specwatch.common.StartError when it cannot start."""
    env = child_env({"SPECWATCH_COLLECTOR_URL": collector_url, **(tokens or {})})
    return start_service("dashboard", command(port), env, log, f"http://127.0.0.1:{port}/_stcore/health", timeout_s)
