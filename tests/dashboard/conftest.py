"""Fixtures shared by the dashboard tests."""

from __future__ import annotations

import pytest

from specwatch.common.procs import free_port, start_collector


@pytest.fixture
def collector(tmp_path):
    """A real `specwatch collector serve` on a fresh SQLite store; its URL."""
    port = free_port()
    process = start_collector(port, tmp_path / "collector.log", f"sqlite:///{tmp_path / 'specwatch.db'}")
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        process.wait(30)
