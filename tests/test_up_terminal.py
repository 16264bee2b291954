"""`make up` and Ctrl-C (issue 55): `up` leads its own foreground process group, so a terminal's Ctrl-C
reaches it and not make, and make exits with up's clean 0. Run under a real pseudo-terminal: make's
recipe runs a stand-in for `up` (the same `lead_the_terminal`, then wait for Ctrl-C), and the test
types ^C into the terminal."""

from __future__ import annotations

import fcntl
import os
import shutil
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
    seen, deadline = b"", time.monotonic() + timeout_s
    while text not in seen and time.monotonic() < deadline:
        try:
            seen += os.read(fd, 1024)
        except OSError:  # the terminal closed: everything on it has exited
            break
    return seen


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
        preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),
    )
    try:
        assert b"ready" in _read_until(terminal, b"ready", 60)
        os.write(terminal, b"\x03")  # Ctrl-C, as typed
        said = _read_until(terminal, b"stopped in order", 30)
        code = make.wait(timeout=30)
    finally:
        make.kill()
        os.close(terminal)
        os.close(side)
    assert b"stopped in order" in said, said
    assert code == 0, (code, said)
