"""TelemetryClient: how producers (the engine) send telemetry to the collector.

    client = TelemetryClient("http://127.0.0.1:8087", spool_dir="data/spool")
    client.submit_request(record)      # never blocks, never raises
    client.flush(timeout=5.0)          # optional: wait until handed over or spooled
    client.close()

Records go into a bounded in-process queue; a background thread sends them in batches
(`batch_size` records or every `flush_interval_s`). A failed send is retried with
exponential backoff (capped, jittered); if the collector stays unreachable the batch is appended to an
fsynced disk spool (`telemetry.spool`), and everything after it follows it there, so
batches reach the collector in submission order once it is back. The spool is bounded
(`max_spool_bytes`); what does not fit is dropped and counted in `stats()`.

A configuration error never drops data: 401/403 (token missing or wrong), 404, 408, 429, 5xx and
connection errors all keep the batch for later. Only the collector's validation answer (400/422 naming
bad records, 413 for a single record over its body limit) drops records, those it names, logged with the
reason; the rest of the batch is sent again. A failing token is one loud log line a minute and
`stats().auth_failing`.
Redelivery is safe: the collector skips records it already holds. Durability starts at
the collector's acknowledgement or the spool's fsync: records still in the in-memory
queue die with the producer process (call `flush`/`close` on shutdown).
"""

from __future__ import annotations

import contextlib
import logging
import queue
import random
import re
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import orjson

from specwatch.telemetry.schema import DeviceSample, EngineEvent, RequestRecord
from specwatch.telemetry.spool import Spool

log = logging.getLogger("specwatch.telemetry")
_KINDS = {RequestRecord: "requests", DeviceSample: "samples", EngineEvent: "events"}
_AUTH = {401, 403}
_CONTENT_REFUSED = {400, 413, 422}  # with the collector's `{"detail": {"error": ...}}`: the records are bad
AUTH_LOG_INTERVAL_S = 60.0
MAX_BACKOFF_S = 30.0


@dataclass(frozen=True)
class ClientStats:
    """Counts since start (records, except `spool_bytes`)."""

    submitted: int
    delivered: int  # acknowledged by the collector (including ones it already held)
    spooled: int  # written to the disk spool (each time)
    spool_bytes: int  # currently waiting on disk
    dropped_queue_full: int
    dropped_spool_full: int
    rejected: int  # refused by the collector as invalid (400/413/422 naming them): retrying cannot help
    auth_failures: int = 0  # sends answered 401/403 (each attempt; the batches stay spooled)
    auth_failing: bool = False  # the last answer was 401/403: the token is missing or wrong
    last_status: int | None = None  # HTTP status of the last send; None: none yet, or no connection


class _Flush:
    def __init__(self) -> None:
        self.done = threading.Event()


_STOP = object()


class TelemetryClient:
    """Batching, spooling sender of telemetry records.

    url: the collector's base URL (POSTs go to `<url>/v1/ingest`).
    spool_dir: where batches wait while the collector is unreachable; None keeps no spool
        (batches that cannot be delivered after the retries are dropped and counted).
    token: bearer token with the collector's `ingest` role (its SPECWATCH_INGEST_TOKEN); ValueError when it
        cannot be sent in a header. Refused (401/403), batches are spooled and retried, never dropped.
    batch_size / flush_interval_s: a batch is sent when it is full or this old.
    max_queue / max_spool_bytes: memory and disk bounds; beyond them records are dropped and counted.
    """

    def __init__(
        self,
        url: str,
        spool_dir: str | Path | None = None,
        token: str | None = None,
        batch_size: int = 500,
        flush_interval_s: float = 1.0,
        *,
        max_queue: int = 100_000,
        max_spool_bytes: int = 256 * 1024 * 1024,
        timeout_s: float = 5.0,
        retries: int = 3,
    ) -> None:
        headers = collector_headers(token)
        self.url = url.rstrip("/") + "/v1/ingest"
        self.batch_size, self.flush_interval_s, self.retries = batch_size, flush_interval_s, retries
        self._queue: queue.Queue = queue.Queue(maxsize=max_queue)
        self._wake = threading.Event()  # a full batch, a flush or a stop: send now, not at the interval's end
        self._spool = _open_spool(spool_dir, max_spool_bytes)
        self._http = httpx.Client(timeout=timeout_s, headers=headers)
        self._counts_lock = threading.Lock()
        self._counts = dict.fromkeys(
            ("submitted", "delivered", "spooled", "queue_full", "spool_full", "rejected", "auth_failures"), 0
        )
        self._token_set = bool(token)
        self._last_status: int | None = None
        self._next_auth_log = 0.0
        self._next_replay = 0.0
        self._backoff = 0.0
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="specwatch-telemetry", daemon=True)
        self._thread.start()

    # -- producer side: never blocks, never raises ------------------------------------------

    def submit_request(self, record: RequestRecord) -> None:
        self._submit(record)

    def submit_sample(self, sample: DeviceSample) -> None:
        self._submit(sample)

    def submit_event(self, event: EngineEvent) -> None:
        self._submit(event)

    def _submit(self, record: Any) -> None:
        try:
            if type(record) not in _KINDS:
                log.error("not a telemetry record: %r", type(record))
                self._bump("rejected", 1)
                return
            if self._closed:
                self._bump("queue_full", 1)
                return
            self._queue.put_nowait(record)
            self._bump("submitted", 1)
            if self._queue.qsize() >= self.batch_size:
                self._wake.set()
        except queue.Full:
            self._bump("queue_full", 1)
        except Exception:  # noqa: BLE001 - telemetry must never take the producer down
            log.exception("telemetry submit failed")

    def flush(self, timeout: float = 5.0) -> bool:
        """Wait until everything submitted so far was delivered or spooled (True) or `timeout` passed."""
        marker = _Flush()
        try:
            self._queue.put(marker, timeout=timeout)
        except queue.Full:
            return False
        self._wake.set()
        return marker.done.wait(timeout)

    def close(self, timeout: float = 5.0) -> None:
        """Flush, then stop the background thread; unsent batches stay in the spool for next time."""
        if self._closed:
            return
        self.flush(timeout)
        self._closed = True
        with contextlib.suppress(queue.Full):
            self._queue.put(_STOP, timeout=timeout)
        self._wake.set()
        self._thread.join(timeout)
        self._http.close()

    def __enter__(self) -> TelemetryClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _bump(self, key: str, n: int) -> None:
        with self._counts_lock:  # producers on several threads update the same counters
            self._counts[key] += n

    def stats(self) -> ClientStats:
        c = self._counts
        spool_bytes = len(self._spool) if self._spool else 0
        return ClientStats(
            c["submitted"],
            c["delivered"],
            c["spooled"],
            spool_bytes,
            c["queue_full"],
            c["spool_full"],
            c["rejected"],
            c["auth_failures"],
            self._last_status in _AUTH,
            self._last_status,
        )

    # -- background thread -------------------------------------------------------------------

    def _run(self) -> None:
        while True:
            records, marker = self._collect()
            try:
                if records:
                    self._deliver(records)
                self._replay(force=marker is not None)
            except Exception:  # noqa: BLE001 - keep the sender alive whatever happens
                log.exception("telemetry sender error")
                time.sleep(0.1)
            finally:
                if isinstance(marker, _Flush):
                    marker.done.set()
            if marker is _STOP:
                return

    def _collect(self) -> tuple[list[Any], Any]:
        """Up to batch_size records, once the flush interval is over or a full batch, a flush or a stop
        woke the sender; stopping early at a flush/stop marker. The sender sleeps in between rather than
        waking for each record: on a producer's request path (the gateway's) a wake per record is CPU
        taken from the event loop."""
        self._wake.wait(self.flush_interval_s)
        self._wake.clear()
        records: list[Any] = []
        while len(records) < self.batch_size:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return records, None
            if item is _STOP or isinstance(item, _Flush):
                return records, item
            records.append(item)
        if self._queue.qsize():
            self._wake.set()  # more waiting (a marker, perhaps): no sleep before the next batch
        return records, None

    def _deliver(self, records: list[Any]) -> None:
        body = _encode(records)
        if self._spool is not None and len(self._spool):
            self._to_spool(body, len(records))  # keep order: older batches are still waiting
        elif not self._send_with_retries(body, len(records)):
            self._to_spool(body, len(records))

    def _send_with_retries(self, body: bytes, n: int) -> bool:
        delay = 0.1
        for attempt in range(self.retries + 1):
            if self._send(body, n):
                return True
            if attempt < self.retries:
                time.sleep(_jitter(delay))
                delay *= 2
        return False

    def _send(self, body: bytes, n: int) -> bool:
        """True when the batch is done with (delivered, or its bad records dropped); False to retry later."""
        try:
            response = self._http.post(self.url, content=body)
        except (httpx.HTTPError, httpx.InvalidURL, OSError):  # unreachable, timed out, misconfigured
            self._last_status = None
            return False
        self._note_status(response.status_code)
        if response.status_code == 200:
            self._bump("delivered", n)
            return True
        if response.status_code == 413 and n > 1:  # over the collector's body limit: send halves
            return all([self._send(half, count) for half, count in _halves(body)])
        detail = _content_refused(response)
        if detail is None:  # auth, throttled, unavailable, misrouted: retrying can help
            return False
        return self._drop_refused(body, n, detail)

    def _drop_refused(self, body: bytes, n: int, detail: dict) -> bool:
        """Drop the records the collector named as bad and send the rest.

        When it names none (e.g. the database refused the batch), halves are sent until the bad record
        is alone, so one bad record never takes its batch down with it."""
        batch = _decode(body)
        named = _named_items(detail)
        if not named and n > 1 and batch is not None:
            return all([self._send(half, count) for half, count in _halves(body)])
        kept = _without_items(batch or {}, named)
        left = sum(len(v) for v in kept.values())
        errors = detail.get("errors") or detail.get("message") or detail
        self._bump("rejected", n - left)
        log.error("collector refused %d of %d records (%s): %s", n - left, n, detail["error"], str(errors)[:500])
        return left == 0 or self._send(orjson.dumps(kept), left)

    def _note_status(self, status: int) -> None:
        """Remember the answer; a 401/403 is counted, and logged loudly at most once a minute."""
        self._last_status = status
        if status not in _AUTH:
            return
        self._bump("auth_failures", 1)
        now = time.monotonic()
        if now < self._next_auth_log:
            return
        self._next_auth_log = now + AUTH_LOG_INTERVAL_S
        problem = "is wrong (or lacks the ingest role)" if self._token_set else "is missing"
        log.error(
            "collector %s answered %d: the ingest token %s. Telemetry is spooled, not dropped, until it is fixed: "
            "pass --collector-token TOKEN or set SPECWATCH_INGEST_TOKEN to one of the collector's ingest tokens",
            self.url,
            status,
            problem,
        )

    def _to_spool(self, body: bytes, n: int) -> None:
        try:
            spooled = self._spool is not None and self._spool.append(body)
        except OSError:  # disk full, permissions: count the batch as dropped, keep running
            log.exception("telemetry spool write failed")
            spooled = False
        self._bump("spooled" if spooled else "spool_full", n)

    def _replay(self, force: bool) -> None:
        """Send spooled batches oldest first; on failure back off (jittered, up to 30 s) before trying again."""
        if self._spool is None or not len(self._spool) or (not force and time.monotonic() < self._next_replay):
            return
        while (head := self._spool.peek()) is not None:
            body, length = head
            if not self._send(body, _count_records(body)):
                self._backoff = min(MAX_BACKOFF_S, max(0.2, self._backoff * 2))
                self._next_replay = time.monotonic() + _jitter(self._backoff)
                return
            self._spool.pop(length)
        self._backoff = 0.0


def collector_headers(token: str | None) -> dict[str, str]:
    """The headers of a producer's POSTs to the collector; ValueError for a token no header can carry."""
    if token is not None and not re.fullmatch(r"[!-~]+", token):
        raise ValueError("the collector token must be printable ASCII without spaces")
    return {"content-type": "application/json"} | ({"authorization": f"Bearer {token}"} if token else {})


def _open_spool(spool_dir: str | Path | None, max_bytes: int) -> Spool | None:
    """The spool, or None (no spool_dir, or it cannot be used: logged, the producer carries on)."""
    if spool_dir is None:
        return None
    try:
        return Spool(spool_dir, max_bytes)
    except OSError:
        log.exception("telemetry spool %s unusable; continuing without one", spool_dir)
        return None


def _jitter(delay: float) -> float:
    """Between half and all of `delay`, so that producers refused together do not retry in step."""
    return delay * random.uniform(0.5, 1.0)


def _content_refused(response: httpx.Response) -> dict | None:
    """The collector's answer when it refused the records themselves (400/413/422), else None.

    Only the collector's own validation answers count (`{"detail": {"error": ...}}`): a proxy's bare 400
    or 413 keeps the batch for a retry."""
    if response.status_code not in _CONTENT_REFUSED:
        return None
    try:
        detail = response.json().get("detail")
    except (ValueError, AttributeError):
        return None
    return detail if isinstance(detail, dict) and isinstance(detail.get("error"), str) else None


def _named_items(detail: dict) -> set[tuple[str, int]]:
    """`{"errors": [{"item": "requests[3]"}, ...]}` -> {("requests", 3)}."""
    named = set()
    for error in detail.get("errors") or ():
        kind, _, index = str(error.get("item") or "").partition("[")
        if index.rstrip("]").isdigit():
            named.add((kind, int(index.rstrip("]"))))
    return named


def _without_items(batch: dict[str, list], named: set[tuple[str, int]]) -> dict[str, list]:
    """The batch less the named items; nothing left when none is named (the whole batch was refused)."""
    if not named:
        return {kind: [] for kind in batch}
    return {kind: [r for i, r in enumerate(items) if (kind, i) not in named] for kind, items in batch.items()}


def _decode(body: bytes) -> dict[str, list] | None:
    """A serialized batch, or None when it is not one (a corrupted spool line)."""
    try:
        batch = orjson.loads(body)
    except orjson.JSONDecodeError:
        return None
    return batch if isinstance(batch, dict) and all(isinstance(v, list) for v in batch.values()) else None


def _encode(records: list[Any]) -> bytes:
    batch: dict[str, list[Any]] = {"requests": [], "samples": [], "events": []}
    for record in records:
        batch[_KINDS[type(record)]].append(record.model_dump(mode="json"))
    return orjson.dumps(batch)


def _halves(body: bytes) -> list[tuple[bytes, int]]:
    """Split a serialized batch into two (each kind's list cut in half); a resent half is deduplicated."""
    batch = orjson.loads(body)
    parts = [{k: v[: len(v) // 2] for k, v in batch.items()}, {k: v[len(v) // 2 :] for k, v in batch.items()}]
    return [(orjson.dumps(p), sum(len(v) for v in p.values())) for p in parts if any(p.values())]


def _count_records(body: bytes) -> int:
    batch = _decode(body)
    return sum(len(v) for v in batch.values()) if batch else 0
