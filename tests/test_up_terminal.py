"""`make up` and Ctrl-C (issue 55): `up` leads its own foreground process group, so a terminal's Ctrl-C
reaches it and not make, and make exits with up's clean 0. Run under a real pseudo-terminal: make's
recipe runs a stand-in for `up` (the same `lead_the_terminal`, then wait for Ctrl-C), and the test
types ^C into the terminal."""

from __future__ import annotations

import os
import pty
import shutil
import sys
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
    pid, terminal = pty.fork()
    if pid == 0:  # the child: a session leading the terminal, as a shell's foreground job
        os.execvp("make", ["make", "-s", "-f", str(makefile), "up"])
    try:
        assert b"ready" in _read_until(terminal, b"ready", 60)
        os.write(terminal, b"\x03")  # Ctrl-C, as typed
        said = _read_until(terminal, b"stopped in order", 30)
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(terminal)
    assert b"stopped in order" in said, said
    assert os.waitstatus_to_exitcode(status) == 0, (os.waitstatus_to_exitcode(status), said)
