"""CaptureClient: how a producer sends its captures (telemetry.capture) to the collector's
`POST /v1/captures`, with the same ingest token as its telemetry.

Unlike `TelemetryClient` it keeps no disk spool, on purpose: a capture is a sample, losing one costs
nothing, and a spool would be a second copy of users' text on the producer's disk that the collector's
retention cannot reach. A batch is retried a few times with backoff, then dropped and counted.
"""

from __future__ import annotations

import logging
import queue
import threading
import time

import httpx
import orjson

from specwatch.telemetry.capture import MAX_CAPTURE_BATCH, Capture, CapturePolicy, Capturer, Redactor
from specwatch.telemetry.client import collector_headers

log = logging.getLogger("specwatch.telemetry")


class CaptureClient:
    def __init__(
        self,
        url: str,
        token: str | None = None,
        *,
        batch_size: int = 32,
        flush_interval_s: float = 2.0,
        max_queue: int = 1024,
        retries: int = 3,
        timeout_s: float = 10.0,
    ) -> None:
        headers = collector_headers(token)
        self.url = url.rstrip("/") + "/v1/captures"
        self.batch_size, self.flush_interval_s, self.retries = (
            min(batch_size, MAX_CAPTURE_BATCH),
            flush_interval_s,
            retries,
        )
        self._http = httpx.Client(timeout=timeout_s, headers=headers, trust_env=False)
        self._queue: queue.Queue = queue.Queue(maxsize=max_queue)
        self._stop = threading.Event()
        self.delivered = self.dropped = 0
        self._thread = threading.Thread(target=self._run, name="specwatch-captures", daemon=True)
        self._thread.start()

    def submit(self, capture: Capture) -> None:
        """Never blocks, never raises: a full queue drops the capture (counted)."""
        try:
            self._queue.put_nowait(capture)
        except queue.Full:
            self.dropped += 1

    def close(self, timeout: float = 5.0) -> None:
        """Send what is queued (within `timeout`), then stop."""
        self._stop.set()
        self._thread.join(timeout)
        self._http.close()

    def _run(self) -> None:
        while not (self._stop.is_set() and self._queue.empty()):
            batch = self._take()
            if batch:
                self._send(batch)

    def _take(self) -> list[Capture]:
        batch, deadline = [], time.monotonic() + self.flush_interval_s
        while len(batch) < self.batch_size:
            wait = 0.05 if self._stop.is_set() else max(0.0, deadline - time.monotonic())
            try:
                batch.append(self._queue.get(timeout=wait))
            except queue.Empty:
                break
        return batch

    def _send(self, batch: list[Capture]) -> None:
        body = orjson.dumps({"captures": [c.model_dump() for c in batch]})
        for attempt in range(self.retries + 1):
            try:
                status = self._http.post(self.url, content=body).status_code
            except httpx.HTTPError as exc:
                status, reason = None, type(exc).__name__
            else:
                reason = f"HTTP {status}"
            if status is not None and status < 300:
                self.delivered += len(batch)
                return
            if status in (400, 413, 422) or attempt == self.retries or self._stop.is_set():
                break
            time.sleep(min(0.5 * 2**attempt, 5.0))
        self.dropped += len(batch)
        log.warning("dropped %d captures: the collector answered %s", len(batch), reason)


def capture_setup(
    spec: str | None, patterns: list[str], hook: str | None, collector: str | None, token: str | None
) -> tuple[Capturer | None, CaptureClient | None]:
    """The capture step and its sender from a server's `--capture`, `--capture-redact` and
    `--capture-hook` (None, None: off, the default). ValueError saying what is wrong."""
    if not spec:
        if patterns or hook:
            raise ValueError("--capture-redact and --capture-hook need --capture")
        return None, None
    if not collector:
        raise ValueError("--capture needs --collector: captures are stored by the collector only")
    capturer = Capturer(CapturePolicy.parse(spec), Redactor.of(patterns, hook))
    return capturer, CaptureClient(collector, token)
