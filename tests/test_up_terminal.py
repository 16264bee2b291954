"""`make up` and Ctrl-C (issue 55): `up` leads its own foreground process group, so a terminal's Ctrl-C
reaches it and not make, and make exits with up's clean 0. Run under a real pseudo-terminal: make's
recipe runs a stand-in for `up` (the same `lead_the_terminal`, then wait for Ctrl-C), and the test
types ^C into the terminal."""

from __future__ import annotations

import fcntl
import os
import select
import shutil
import signal
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
STAND_IN = """
import time
from specwatch.up import lead_the_terminal
give_back = lead_the_terminal()
try:
    print("ready", flush=True)
    time.sleep(60)
except KeyboardInterrupt:
    print("stopped in order", flush=True)
finally:
    give_back()
"""


def _read_until(fd: int, text: bytes, timeout_s: float) -> bytes:
    """What the terminal shows until `text` or the timeout. Each read waits in `select` first: this process
    holds the terminal's other side open, so a read after everything on it has exited would block for ever."""
    seen, deadline = b"", time.monotonic() + timeout_s
    while text not in seen:
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            break
        try:
            seen += os.read(fd, 1024)
        except OSError:  # the terminal closed: everything on it has exited
            break
    return seen


def _foreground_job() -> None:
    """In make's process before it runs: the job-control signals at their defaults, as a shell starts a
    foreground job (ignored ones are inherited: under a test runner that ignores SIGINT, Ctrl-C would reach
    nothing), and the pty as the controlling terminal."""
    for number in (signal.SIGINT, signal.SIGQUIT, signal.SIGTSTP, signal.SIGTTIN, signal.SIGTTOU):
        signal.signal(number, signal.SIG_DFL)
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_ctrl_c_under_make_exits_0(tmp_path):
    script = tmp_path / "up.py"
    script.write_text(STAND_IN)
    makefile = tmp_path / "Makefile"
    makefile.write_text(f"up:\n\t@PYTHONPATH={REPO} {sys.executable} {script}\n")
    terminal, side = os.openpty()
    # make leads a new session whose controlling terminal is the pty, as a shell's foreground job; this
    # process keeps the terminal's other side open, so what make's child writes last is never dropped by
    # the hang-up when they exit (Linux may discard unread output then)
    make = subprocess.Popen(
        ["make", "-s", "-f", str(makefile), "up"],
        stdin=side,
        stdout=side,
        stderr=side,
        start_new_session=True,
        preexec_fn=_foreground_job,
    )
    try:
        started = _read_until(terminal, b"ready", 60)
        assert b"ready" in started, (started, make.poll())
        os.write(terminal, b"\x03")  # Ctrl-C, as typed
        said = _read_until(terminal, b"stopped in order", 30)
        code = make.wait(timeout=30)
    finally:
        make.kill()
        os.close(terminal)
        os.close(side)
    assert b"stopped in order" in said, (said, code)
    assert code == 0, (code, said)
