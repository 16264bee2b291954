"""Starting the collector service as a child process and waiting until it is ready
(used by `specwatch up`, the crash-safety test and the benchmarks)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

SOURCE_ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    """A TCP port free on the loopback interface right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class CollectorStartError(RuntimeError):
    pass


def start_collector(port: int, log: Path, db_url: str | None = None, env: dict[str, str] | None = None,
                    timeout_s: float = 60.0) -> subprocess.Popen:
    """`specwatch collector serve` on 127.0.0.1:`port`, output appended to `log`; returns once /readyz answers 200."""
    cmd = [sys.executable, "-m", "specwatch", "collector", "serve", "--port", str(port), *(["--db", db_url] if db_url else [])]
    child_env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(SOURCE_ROOT), os.environ.get("PYTHONPATH")])), **(env or {})}
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        process = subprocess.Popen(cmd, env=child_env, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise CollectorStartError(f"the collector exited with code {process.returncode}; see {log} (is port {port} free?)")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    process.kill()
    raise CollectorStartError(f"the collector did not become ready on port {port} within {timeout_s:.0f} s; see {log}")
