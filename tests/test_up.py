"""`specwatch up --once`: collector + engine + dashboard + sample traffic end to end, telemetry stored."""

from __future__ import annotations

import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml
from processes import children, running
from waiting import wait_for

from specwatch import up
from specwatch.common.procs import child_env, free_port, specwatch_command
from specwatch.up_rules import CALIBRATION_REQUESTS

REPO = Path(__file__).resolve().parents[1]


def test_up_once_stores_the_sample_traffic(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    ports = [str(free_port()) for _ in range(3)]
    cmd = specwatch_command("up", "--once", "--requests", "3", "--max-tokens", "16", "--data-dir", str(tmp_path))
    cmd += ["--port", ports[0], "--engine-port", ports[1], "--dashboard-port", ports[2]]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    # stored with up's ingest token, read with its read token; the calibration's plain requests come first
    assert f"collector, last 60 min: {3 + CALIBRATION_REQUESTS} requests" in done.stdout
    assert "access control: tokens for ingest, read, admin" in (tmp_path / "collector.log").read_text()
    assert f"dashboard  http://127.0.0.1:{ports[2]}" in done.stdout
    with sqlite3.connect(tmp_path / "specwatch.db") as db:
        rows = db.execute(
            "select arm, drafter, json_extract(tags, '$.scenario') from requests "
            "where json_extract(tags, '$.scenario') != 'calibration'"
        ).fetchall()
        events = {kind for (kind,) in db.execute("select kind from engine_events")}
    assert len(rows) == 3 and {(arm, drafter) for arm, drafter, _ in rows} <= {("spec", "ngram"), ("control", None)}
    assert {scenario for *_, scenario in rows} <= {"grounded", "code-edit"}
    assert {"cold_start", "config"} <= events
    rules = yaml.safe_load((tmp_path / "alert-rules.yaml").read_text())
    assert rules["remediation"]["engines"] == {"*": f"http://127.0.0.1:{ports[1]}"}
    ttft = next(rule for rule in rules["rules"] if rule["name"] == "TTFTP99High")
    measured = re.search(r"this machine: prefill ([\d,]+) ms, decode ([\d,]+) ms/token", done.stdout)
    assert measured, done.stdout
    assert ttft["threshold"] >= 0.3 and f"TTFTP99High set from 0.3 s to {ttft['threshold']:g} s" in done.stdout
    assert "MemoryFragmentationHigh" not in {rule["name"] for rule in rules["rules"]}  # on a CPU
    assert "MemoryFragmentationHigh: not applicable on a CPU" in done.stdout


def test_up_rejects_bad_arguments():
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run(
        [sys.executable, "-m", "specwatch", "up", "--port", "0"], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 2 and "--port" in done.stderr


def test_ctrl_c_stops_up_in_order_with_one_line_and_no_child_left(tmp_path):
    """SIGINT to up's whole process group mid-phase, as a terminal's Ctrl-C: the children run in their own
    sessions, so up stops traffic, engine, dashboard, then the collector; every answered request is stored."""
    ports = [str(free_port()) for _ in range(3)]
    cmd = specwatch_command("up", "--max-tokens", "8", "--phase-seconds", "600", "--data-dir", str(tmp_path))
    cmd += ["--port", ports[0], "--engine-port", ports[1], "--dashboard-port", ports[2]]
    log = tmp_path / "up.out"
    with log.open("w") as out:
        up = subprocess.Popen(
            cmd, stdout=out, stderr=subprocess.STDOUT, env=child_env(), start_new_session=True, preexec_fn=_ctrl_c_live
        )
    try:
        # mid-phase: the collector may store the calibration's records before it answers /readyz
        in_phase = lambda: "traffic    phase:" in log.read_text() and _stored(tmp_path / "specwatch.db") >= 2  # noqa: E731
        wait_for(in_phase, lambda: log.read_text(), timeout=300)
        family = _descendants(up.pid)
        os.killpg(up.pid, signal.SIGINT)
        try:
            code = up.wait(timeout=120)
        except subprocess.TimeoutExpired:
            pytest.fail(f"up still runs 120 s after SIGINT: {_stuck(up.pid, family, tmp_path)}")
        assert code == 0, log.read_text()
    finally:
        if up.poll() is None:
            os.killpg(up.pid, signal.SIGKILL)
    output = log.read_text()
    assert "Traceback" not in output and "Ctrl-C stops everything" in output
    summary = re.search(r"stopped after .*; (\d+) requests done \((\d+) failed\), (\d+) stored", output)
    assert summary, output
    done, failed, stored = map(int, summary.groups())
    assert failed == 0  # the engine outlived the traffic
    assert stored >= done >= 2  # the engine stopped before the collector: its last telemetry is stored
    assert len(family) >= 3 and not [pid for pid in family if running(pid)]


def test_a_ctrl_c_that_lands_in_a_finalizer_still_stops_up():
    """Python drops a KeyboardInterrupt raised while a finalizer runs (and prints a traceback); `up`'s hook
    delivers it again, so the stop happens where it can; other unraisable errors reach the previous hook."""

    class Finalized:
        def __init__(self, error: type[BaseException]) -> None:
            self.error = error

        def __del__(self) -> None:
            raise self.error

    seen = []
    previous = signal.signal(signal.SIGTERM, up._sigterm_as_ctrl_c)
    hook, sys.unraisablehook = sys.unraisablehook, up._ctrl_c_in_a_finalizer(seen.append)
    try:
        Finalized(ValueError)  # collected at once: its error is unraisable
        assert [u.exc_type for u in seen] == [ValueError]
        with pytest.raises(KeyboardInterrupt):
            Finalized(KeyboardInterrupt)
            time.sleep(5)  # the interrupt arrives long before this ends
        assert len(seen) == 1
    finally:
        sys.unraisablehook = hook
        signal.signal(signal.SIGTERM, previous)


def test_sigterm_while_the_model_loads_leaves_no_child(tmp_path):
    up, family = _up_loading_the_model(tmp_path)
    up.terminate()
    output = up.communicate(timeout=60)[0]
    assert up.returncode == 0 and "Traceback" not in output
    assert "0 requests done (0 failed)" in output
    assert family and not [pid for pid in family if running(pid)]


def test_children_exit_when_up_is_killed(tmp_path):
    """up SIGKILLed cannot stop its children: they get SIGTERM from the kernel (PR_SET_PDEATHSIG)."""
    up, family = _up_loading_the_model(tmp_path)
    up.kill()
    up.communicate(timeout=10)
    wait_for(lambda: not [pid for pid in family if running(pid)], "the collector and engine to exit", timeout=60)


def _up_loading_the_model(tmp_path: Path) -> tuple[subprocess.Popen, list[int]]:
    """`specwatch up` once its engine process loads the model (the collector starts after it); its descendants."""
    ports = [str(free_port()) for _ in range(2)]
    cmd = specwatch_command("up", "--no-dashboard", "--data-dir", str(tmp_path), "--port", ports[0])
    cmd += ["--engine-port", ports[1]]
    up = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=child_env())
    wait_for(lambda: "loading the model" in up.stdout.readline(), "the engine to start loading", timeout=120)
    wait_for(lambda: len(children(up.pid)) >= 1, "the engine process", timeout=30)
    return up, _descendants(up.pid)


def _ctrl_c_live() -> None:
    """Start `up` with SIGINT at its default, as a terminal's foreground job has it. A test run started in
    the background by a shell without job control (`bash .ci/run &`) ignores SIGINT, every child inherits
    that, and Python keeps an ignored SIGINT ignored: `up` would never see this test's Ctrl-C."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _stuck(pid: int, family: list[int], data_dir: Path) -> str:
    """What a hung stop leaves to read: which processes still run, and the tail of every log."""
    alive = [p for p in [pid, *family] if running(p)]
    logs = [f"--- {p.name} ---\n{p.read_text(errors='replace')[-3000:]}" for p in sorted(data_dir.glob("*.log"))]
    return "\n".join([f"still running: {alive}", f"--- up.out ---\n{(data_dir / 'up.out').read_text()[-3000:]}", *logs])


def _stored(db: Path) -> int:
    try:
        with sqlite3.connect(db) as conn:
            return conn.execute("select count(*) from requests").fetchone()[0]
    except sqlite3.Error:
        return 0


def _descendants(pid: int) -> list[int]:
    found = children(pid)
    return found + [grandchild for child in found for grandchild in _descendants(child)]
