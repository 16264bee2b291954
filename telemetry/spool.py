"""An append-only, fsynced disk spool of ingest batches, replayed in order.

Layout: `<dir>/<seq>.jsonl` segments, one JSON batch per line, plus `cursor` (the
segment and byte offset of the next batch to send). A line is only trusted once its
newline is on disk, so a crash mid-append leaves a torn tail that is cut off on open.
Replay is at-least-once: a batch sent but not yet marked in `cursor` when the process dies
is sent again, and the collector skips it as a duplicate (records carry idempotency keys).

Single-threaded by design: only the client's background thread touches it.
"""

from __future__ import annotations

import os
from pathlib import Path

import orjson

SEGMENT_BYTES = 4 * 1024 * 1024


class Spool:
    def __init__(self, directory: str | Path, max_bytes: int) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.max_bytes = max_bytes
        self._cursor_path = self.dir / "cursor"
        self._segments = sorted(int(p.stem) for p in self.dir.glob("*.jsonl") if p.stem.isdigit())
        self._head_offset = self._read_cursor()
        if self._segments:
            _cut_torn_tail(self._path(self._segments[-1]))
        self.size = sum(self._path(s).stat().st_size for s in self._segments) - self._head_offset

    def _path(self, seq: int) -> Path:
        return self.dir / f"{seq:012d}.jsonl"

    def _read_cursor(self) -> int:
        try:
            seq, offset = orjson.loads(self._cursor_path.read_bytes())
        except (FileNotFoundError, orjson.JSONDecodeError, ValueError, TypeError):
            return 0
        # Segments before the cursor's were fully sent; a crash may have left them behind.
        for old in [s for s in self._segments if s < seq]:
            self._path(old).unlink(missing_ok=True)
            self._segments.remove(old)
        return offset if self._segments and self._segments[0] == seq else 0

    def __len__(self) -> int:
        """Bytes waiting to be replayed (0 when empty)."""
        return self.size

    def append(self, batch: bytes) -> bool:
        """Durably append one serialized batch; False (nothing written) when it would exceed max_bytes."""
        line = batch + b"\n"
        if self.size + len(line) > self.max_bytes:
            return False
        if not self._segments or self._path(self._segments[-1]).stat().st_size >= SEGMENT_BYTES:
            self._segments.append(self._segments[-1] + 1 if self._segments else 1)
        with open(self._path(self._segments[-1]), "ab") as f:
            start = f.tell()
            try:
                f.write(line)
                f.flush()
                os.fsync(f.fileno())
            except OSError:
                f.truncate(start)  # leave no torn line in the middle of the segment
                raise
        _fsync_dir(self.dir)
        self.size += len(line)
        return True

    def peek(self) -> tuple[bytes, int] | None:
        """The oldest unsent batch and its length on disk, or None."""
        while self._segments:
            with open(self._path(self._segments[0]), "rb") as f:
                f.seek(self._head_offset)
                line = f.readline()
            if line.endswith(b"\n"):
                return line[:-1], len(line)
            self._drop_head_segment()
        return None

    def pop(self, length: int) -> None:
        """Mark the batch returned by `peek` as delivered."""
        self._head_offset += length
        self.size -= length
        head = self._segments[0]
        if self._head_offset >= self._path(head).stat().st_size:
            self._drop_head_segment()
        else:
            self._write_cursor(head, self._head_offset)

    def _drop_head_segment(self) -> None:
        head = self._segments.pop(0)
        self._head_offset = 0
        if self._segments:
            self._write_cursor(self._segments[0], 0)
        self._path(head).unlink(missing_ok=True)
        if not self._segments:
            self._cursor_path.unlink(missing_ok=True)
            self.size = 0
        _fsync_dir(self.dir)

    def _write_cursor(self, seq: int, offset: int) -> None:
        tmp = self._cursor_path.with_suffix(".tmp")
        with open(tmp, "wb") as f:
            f.write(orjson.dumps([seq, offset]))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self._cursor_path)
        _fsync_dir(self.dir)


def _cut_torn_tail(path: Path) -> None:
    data = path.read_bytes()
    end = data.rfind(b"\n") + 1
    if end != len(data):
        with open(path, "r+b") as f:
            f.truncate(end)
            os.fsync(f.fileno())


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
