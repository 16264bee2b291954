"""The test session's own PostgreSQL (tests/postgres_server.py): two at once do not collide, stopping
removes everything, and a server left by a killed session is reaped by the next one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from postgres_server import MISSING, EphemeralPostgres, find_bin_dir, reap_stale
from sqlalchemy import create_engine, text

BIN_DIR = find_bin_dir()
pytestmark = pytest.mark.skipif(BIN_DIR is None, reason=MISSING)


def answers(url: str) -> int:
    db = create_engine(url)
    try:
        with db.connect() as conn:
            return conn.execute(text("select 1")).scalar()
    finally:
        db.dispose()


def test_two_servers_at_once_on_their_own_ports_removed_when_stopped():
    first, second = EphemeralPostgres(BIN_DIR), EphemeralPostgres(BIN_DIR)
    try:
        urls = first.start(), second.start()
        roots = first.root, second.root
        assert urls[0] != urls[1]
        assert [answers(url) for url in urls] == [1, 1]
    finally:
        first.stop()
        second.stop()
    assert not any(root.exists() for root in roots)


def test_a_server_whose_session_died_is_reaped():
    server = EphemeralPostgres(BIN_DIR)
    url = server.start()
    root = server.root
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (root / "owner").write_text(dead.stdout.strip())
    reap_stale()
    assert not Path(root).exists()
    with pytest.raises(Exception, match="refused|connect"):
        answers(url)
