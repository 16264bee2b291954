"""A producer's one telemetry sink. In the engine the scheduler hands it request records, the device
sampler samples, the policy and the control actions events; in the gateway the proxy hands it a
record per request and the gateway its config and upstream-health events. With spans on, each
request record also ends that request's OpenTelemetry span (telemetry.spans).

Each item goes to the collector's `TelemetryClient` when one is configured and to local
consumers (the Prometheus metrics, a test's list). Consumers run on the producer's thread, so
they must be cheap (the client only enqueues); one that fails is logged, never raised:
telemetry must not take a request down.
"""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Callable, Mapping
from typing import TypeVar

from specwatch.telemetry.capture import Capturer, Kind
from specwatch.telemetry.client import TelemetryClient
from specwatch.telemetry.schema import DeviceSample, EngineEvent, RequestRecord
from specwatch.telemetry.spans import RequestSpans, operation, request_attributes

log = logging.getLogger("specwatch.telemetry")

Item = TypeVar("Item", RequestRecord, DeviceSample, EngineEvent)


class TelemetrySink:
    """`spans`: one OpenTelemetry span per request (telemetry.spans; None: off), ended as its record comes."""

    def __init__(
        self,
        instance: str | None = None,
        client: TelemetryClient | None = None,
        spans: RequestSpans | None = None,
        capturer: Capturer | None = None,
        capture_client=None,
    ) -> None:
        self.instance = instance or socket.gethostname()  # the `instance` of its events (and of the engine's samples)
        self.client = client  # for /metrics: whether its deliveries are refused, what waits in its spool
        self._consumers: dict[type, list[Callable]] = {RequestRecord: [], DeviceSample: [], EngineEvent: []}
        if client is not None:
            self.subscribe(RequestRecord, client.submit_request)
            self.subscribe(DeviceSample, client.submit_sample)
            self.subscribe(EngineEvent, client.submit_event)
        self.spans = spans  # the servers begin a request's span when it arrives (RequestSpans.begin)
        if spans is not None:
            self.subscribe(RequestRecord, spans.finish)
        # captures (telemetry.capture): off unless a policy is given; sent by a CaptureClient (or kept by a test)
        self.capturer, self.capture_client = capturer, capture_client

    def wants_capture(self, request_id: str, tags: Mapping[str, str], prompt_tokens: int | None = None) -> bool:
        """Whether the request may be captured (decided at arrival: the gateway then keeps its stream's text)."""
        return self.capturer is not None and self.capturer.policy.selects(request_id, dict(tags), prompt_tokens)

    def capture(self, record: RequestRecord, prompt: list[dict], output: str, kind: Kind) -> None:
        """Capture a finished request's text when the policy keeps it (redacted and capped first)."""
        if self.capturer is None:
            return
        try:
            found = self.capturer.capture(record, prompt, output, kind)
            if found is not None and self.capture_client is not None:
                self.capture_client.submit(found)
        except Exception:
            log.exception("capture failed")

    def subscribe(self, kind: type[Item], consumer: Callable[[Item], None]) -> None:
        self._consumers[kind].append(consumer)

    def begin_span(self, request_id: str, headers: Mapping[str, str], path: str, body: Mapping) -> dict[str, str]:
        """With spans on, start the request's span (RequestSpans.begin; `path`: its OpenAI route, `body`: its
        JSON body) and return the trace headers that make an upstream's span its child; else {}."""
        if self.spans is None:
            return {}
        return self.spans.begin(request_id, headers, request_attributes(operation(path), body))

    def drop_span(self, request_id: str) -> None:
        """Forget the span of a request refused before it ran (no record will end it)."""
        if self.spans is not None:
            self.spans.drop(request_id)

    def close_spans(self) -> None:
        """Export the spans still queued (at the server's exit)."""
        if self.spans is not None:
            self.spans.shutdown()

    def emit(self, kind: str, detail: dict, duration_s: float | None = None) -> None:
        """An EngineEvent of this instance, now (the `emit` the control actions take)."""
        try:
            event = EngineEvent(
                instance=self.instance, at=time.time(), kind=kind, detail=_finite(detail), duration_s=duration_s
            )
        except ValueError:  # e.g. a detail over the contract's 4 KiB
            log.exception("dropped a %s event", kind)
            return
        self.put(event)

    def put(self, item: RequestRecord | DeviceSample | EngineEvent) -> None:
        """Hand `item` to every consumer of its type."""
        for consumer in self._consumers[type(item)]:
            try:
                consumer(item)
            except Exception:
                log.exception("telemetry consumer failed")


def _finite(detail: dict) -> dict:
    """Event details travel as JSON: NaN becomes None."""
    return {k: (v if not isinstance(v, float) or v == v else None) for k, v in detail.items()}
