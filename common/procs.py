"""Child services: start one and wait until it is ready, stop it, and have Linux stop it with its
parent (`specwatch up`, the tests and the benchmarks)."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

from specwatch.common.auth import first_token


def free_port() -> int:
    """A TCP port free on the loopback interface right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class StartError(RuntimeError):
    """A child service exited or did not become ready; the message names its log."""


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This environment with `extra` on top (the child runs this interpreter, so specwatch is importable)."""
    return {**os.environ, **(extra or {})}


def start_service(
    name: str, cmd: list[str], env: dict[str, str], log: Path, ready_url: str, timeout_s: float
) -> subprocess.Popen:
    """Start `cmd` with output appended to `log`; return once `ready_url` answers 200.
    Raises StartError (and kills the child) if it exits first or is not ready in time.
    The child runs in its own session, so a terminal's Ctrl-C reaches only its parent, which stops
    its children in order; and it gets SIGTERM when its parent dies (see `_exit_with_parent`)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("ab") as out:
        process = subprocess.Popen(
            cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=_exit_with_parent()
        )
    key = first_token(env.get("SPECWATCH_API_KEY"))  # a child given an API key wants it on its /v1 routes
    try:
        return _wait_ready(name, process, log, ready_url, timeout_s, {"authorization": f"Bearer {key}"} if key else {})
    except BaseException:  # not ready, or Ctrl-C while waiting: no half-started child left behind
        stop_process(process, timeout_s=10)
        raise


def _wait_ready(
    name: str, process: subprocess.Popen, log: Path, ready_url: str, timeout_s: float, headers: dict[str, str]
) -> subprocess.Popen:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise StartError(f"the {name} exited with code {process.returncode}; see {log} (is its port free?)")
        try:
            if httpx.get(ready_url, timeout=1, headers=headers).status_code == 200:
                return process
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise StartError(f"the {name} did not answer {ready_url} within {timeout_s:.0f} s; see {log}")


def stop_process(process: subprocess.Popen, timeout_s: float = 30.0) -> None:
    """SIGTERM, and SIGKILL if it has not exited within `timeout_s`."""
    if process.poll() is None:
        process.terminate()
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _exit_with_parent():
    """A preexec_fn asking Linux to send the child SIGTERM when its parent dies, even by SIGKILL
    (prctl PR_SET_PDEATHSIG; strictly, when the parent's thread that started it ends: start services
    from a thread that outlives them). None where there is no prctl: there a killed parent leaves them."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl  # looked up before the fork, not in the child
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def arm() -> None:
        prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM))
        if os.getppid() != parent:  # the parent died before the signal was armed
            os.kill(os.getpid(), signal.SIGTERM)

    return arm


def specwatch_command(*args: str) -> list[str]:
    """`python -m specwatch ARGS...` on this interpreter, so a child runs the same code and environment."""
    return [sys.executable, "-m", "specwatch", *args]


def start_collector(
    port: int, log: Path, db_url: str | None = None, env: dict[str, str] | None = None, timeout_s: float = 60.0
) -> subprocess.Popen:
    """`specwatch collector serve` on 127.0.0.1:`port`, output appended to `log`; returns once /readyz answers 200."""
    cmd = specwatch_command("collector", "serve", "--port", str(port), *(["--db", db_url] if db_url else []))
    return start_service("collector", cmd, child_env(env), log, f"http://127.0.0.1:{port}/readyz", timeout_s)
