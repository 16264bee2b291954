"""Processes by /proc (Linux): a service's children, and whether one still runs."""

from __future__ import annotations

from pathlib import Path


def children(pid: int) -> list[int]:
    return [p for p in _pids() if _stat(p) and int(_stat(p)[1]) == pid]


def running(pid: int) -> bool:
    stat = _stat(pid)
    return bool(stat) and stat[0] != "Z"


def _pids() -> list[int]:
    return [int(entry.name) for entry in Path("/proc").iterdir() if entry.name.isdigit()]


def _stat(pid: int) -> list[str]:
    """(state, ppid, ...) from /proc/<pid>/stat; [] once the process is gone."""
    try:
        return (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return []
