"""The disk spool: ordered, durable across restarts, torn tails cut, bounded."""

from __future__ import annotations

import pytest

from specwatch.telemetry import spool as spool_module
from specwatch.telemetry.spool import Spool


def drain(spool: Spool) -> list[bytes]:
    out = []
    while (head := spool.peek()) is not None:
        out.append(head[0])
        spool.pop(head[1])
    return out


def test_replays_in_order_and_empties(tmp_path):
    spool = Spool(tmp_path, max_bytes=10_000)
    for i in range(5):
        assert spool.append(b'{"n":%d}' % i)
    assert len(spool) == sum(len(b'{"n":%d}\n' % i) for i in range(5))
    assert drain(spool) == [b'{"n":%d}' % i for i in range(5)]
    assert len(spool) == 0 and list(tmp_path.iterdir()) == []


def test_cursor_survives_restart(tmp_path):
    spool = Spool(tmp_path, max_bytes=10_000)
    for i in range(4):
        spool.append(b"batch-%d" % i)
    body, length = spool.peek()
    spool.pop(length)
    reopened = Spool(tmp_path, max_bytes=10_000)
    assert len(reopened) == len(spool)
    assert drain(reopened) == [b"batch-1", b"batch-2", b"batch-3"]


def test_torn_tail_is_cut_on_open(tmp_path):
    spool = Spool(tmp_path, max_bytes=10_000)
    spool.append(b"complete")
    segment = next(tmp_path.glob("*.jsonl"))
    with open(segment, "ab") as f:
        f.write(b'{"half": ')  # the process died mid-append
    reopened = Spool(tmp_path, max_bytes=10_000)
    assert drain(reopened) == [b"complete"]


def test_segments_rotate_and_are_deleted_once_sent(tmp_path, monkeypatch):
    monkeypatch.setattr(spool_module, "SEGMENT_BYTES", 10)  # one batch per segment
    spool = Spool(tmp_path, max_bytes=10_000)
    for i in range(6):
        spool.append(b"0123456789-%d" % i)
    assert len(list(tmp_path.glob("*.jsonl"))) == 6
    for _ in range(3):
        spool.pop(spool.peek()[1])
    assert len(list(tmp_path.glob("*.jsonl"))) == 3
    assert drain(Spool(tmp_path, max_bytes=10_000)) == [b"0123456789-%d" % i for i in range(3, 6)]


def test_refuses_appends_beyond_max_bytes(tmp_path):
    spool = Spool(tmp_path, max_bytes=23)
    assert spool.append(b"x" * 10) and spool.append(b"y" * 10)
    assert not spool.append(b"z")
    assert len(spool) == 22


def test_failed_append_leaves_no_torn_line(tmp_path, monkeypatch):
    spool = Spool(tmp_path, max_bytes=10_000)
    spool.append(b"first")
    real_fsync = spool_module.os.fsync

    def failing_fsync(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(spool_module.os, "fsync", failing_fsync)  # the disk fills up mid-append
    with pytest.raises(OSError):
        spool.append(b"second")
    monkeypatch.setattr(spool_module.os, "fsync", real_fsync)
    spool.append(b"third")
    assert drain(Spool(tmp_path, max_bytes=10_000)) == [b"first", b"third"]
