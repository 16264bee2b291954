"""Helpers every package shares; imports nothing of ours, so anything may import it.

`UsageError` and `tcp_port` for command lines (a usage error is one line and exit code 2);
`free_port`, `child_env`, `start_service` and `start_collector` for starting services as child
processes and waiting until they are ready (`specwatch up`, the tests and the benchmarks)."""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

SOURCE_ROOT = Path(__file__).resolve().parents[1]


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit code 2."""


def tcp_port(value: str) -> int:
    """argparse type for --port options."""
    if not value.isdigit() or not 0 < int(value) < 65536:
        raise argparse.ArgumentTypeError(f"not a TCP port: {value!r}")
    return int(value)


def free_port() -> int:
    """A TCP port free on the loopback interface right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class StartError(RuntimeError):
    """A child service exited or did not become ready; the message names its log."""


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment, with the source tree importable and `extra` on top."""
    path = os.pathsep.join(filter(None, [str(SOURCE_ROOT), os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, **(extra or {})}


def start_service(
    name: str, cmd: list[str], env: dict[str, str], log: Path, ready_url: str, timeout_s: float
) -> subprocess.Popen:
    """Start `cmd` with output appended to `log`; return once `ready_url` answers 200.
    Raises StartError (and kills the child) if it exits first or is not ready in time."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        process = subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise StartError(f"the {name} exited with code {process.returncode}; see {log} (is its port free?)")
        try:
            if httpx.get(ready_url, timeout=1).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    process.kill()
    raise StartError(f"the {name} did not answer {ready_url} within {timeout_s:.0f} s; see {log}")


def specwatch_command(*args: str) -> list[str]:
    """`python -m specwatch ARGS...` on this interpreter, so a child runs the same code and environment."""
    return [sys.executable, "-m", "specwatch", *args]


def start_collector(
    port: int, log: Path, db_url: str | None = None, env: dict[str, str] | None = None, timeout_s: float = 60.0
) -> subprocess.Popen:
    """`specwatch collector serve` on 127.0.0.1:`port`, output appended to `log`; returns once /readyz answers 200."""
    cmd = specwatch_command("collector", "serve", "--port", str(port), *(["--db", db_url] if db_url else []))
    return start_service("collector", cmd, child_env(env), log, f"http://127.0.0.1:{port}/readyz", timeout_s)
