"""The gateway's shared state, which every route reads: its upstreams and their health, the router,
the HTTP clients to the upstreams, its /metrics registry and its telemetry sink.

Two clients, one per job. Proxied requests go through `session` (aiohttp): with its C HTTP parser a
request costs a third (whole answers) to a half (16-chunk streams) of httpx's CPU, measured side by side
against one upstream (`bench/http_clients.py`), and that CPU is the gateway's overhead at low load.
Health checks, /metrics scrapes, markers and /v1/models (a few requests a second) use `http` (httpx).

Records and events leave through one `TelemetrySink` (as the engine's do): the collector's client,
the router (its acceptance window), /metrics and a test's list are its consumers.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass

import aiohttp
import httpx
from prometheus_client import CollectorRegistry

from specwatch.common.http import ControlGuard
from specwatch.gateway.markers import UpstreamMarkers
from specwatch.gateway.metrics import GatewayMetrics
from specwatch.gateway.records import Outcome
from specwatch.gateway.routing import Router
from specwatch.gateway.upstreams import Upstream, UpstreamState
from specwatch.telemetry.schema import RequestRecord
from specwatch.telemetry.sink import TelemetrySink

MAX_REPORTED_UPSTREAMS = 16  # an event's detail holds at most 4 KiB
FAILED_CHECKS_DOWN = 3  # health checks failing in a row (refused connections aside) before an upstream is down


class UnhealthyAnswer(Exception):
    """An upstream's /health answered, but not 200."""


@dataclass(frozen=True)
class GatewaySettings:
    name: str = "gateway"  # its events' instance, and that of records for requests no upstream took
    max_body_bytes: int = 4 * 1024 * 1024
    body_timeout_s: float = 30.0  # the whole request body must arrive within this
    whole_response_bytes: int = 1024 * 1024  # a non-streamed answer up to this is held and checked whole
    max_response_bytes: int = 64 * 1024 * 1024  # a larger one is relayed as it arrives (gateway.whole), to this
    upstream_timeout_s: float = 600.0  # longest wait for an upstream's next bytes
    connect_timeout_s: float = 2.0
    health_interval_s: float = 1.0
    control_token: str | None = None
    api_key: str | None = None  # bearer key(s) the /v1 routes require (common.http.ApiKeyMiddleware)
    count_tokens: Callable[[str], int] | None = None  # a tokenizer; None: estimate 4 characters per token


class Gateway:
    """`sink`: where records and events go (None: a sink of its own, with no collector client)."""

    def __init__(
        self, upstreams: list[Upstream], router: Router, settings: GatewaySettings, sink: TelemetrySink | None = None
    ) -> None:
        self.states = {u.name: UpstreamState(u) for u in upstreams}
        self.router, self.settings = router, settings
        self.sink = sink or TelemetrySink(settings.name)
        self.guard = ControlGuard(settings.control_token, "gateway")
        self.registry = CollectorRegistry()
        self.metrics = GatewayMetrics(self.states, self.registry)
        self.sink.subscribe(RequestRecord, router.observe)
        self.sink.subscribe(RequestRecord, self.metrics.observe)
        self.markers = UpstreamMarkers(self.sink)  # config events: an upstream's version and speculative config
        self.http: httpx.AsyncClient | None = None  # health checks, scrapes, markers, /v1/models
        self.session: aiohttp.ClientSession | None = None  # proxied requests (gateway.proxy)

    # -- upstream selection --------------------------------------------------------------------

    def pool(self, name: str) -> list[UpstreamState]:
        return [s for s in self.states.values() if s.upstream.pool == name]

    def pool_load(self, name: str) -> float:
        """The healthy part of a pool: its least-loaded upstream's load (where the next request goes)."""
        loads = [s.load for s in self.pool(name) if s.healthy]
        return min(loads) if loads else float("inf")

    def pick(self, pool: str, exclude: set[str]) -> UpstreamState | None:
        """The healthy upstream of `pool` with the lowest load, not yet tried for this request."""
        candidates = [s for s in self.pool(pool) if s.healthy and s.upstream.name not in exclude]
        return min(candidates, key=lambda s: s.load, default=None)

    # -- health ----------------------------------------------------------------------------------

    async def watch_health(self) -> None:
        while True:
            await asyncio.sleep(self.settings.health_interval_s)
            await self.check_all()

    async def check_all(self) -> None:
        """Health-check and scrape every upstream; an 'upstream' event when any health changed."""
        before = [s.healthy for s in self.states.values()]
        await asyncio.gather(*(self.check(state) for state in self.states.values()))
        await self.markers.check_all(self.http, self.states.values())
        if before != [s.healthy for s in self.states.values()]:
            self.emit_upstreams()

    def emit_upstreams(self) -> None:
        """The health of every upstream, one snapshot per event (the dashboard's Sources page reads the last)."""
        upstreams = [_describe(s) for s in list(self.states.values())[:MAX_REPORTED_UPSTREAMS]]
        self.sink.emit("upstream", {"role": "gateway", "upstreams": upstreams})

    async def check(self, state: UpstreamState) -> None:
        """One health check. Nothing listening there (connection refused) is down at once; any other
        failure (a timeout, an error status, a broken answer) only after FAILED_CHECKS_DOWN in a row:
        a busy upstream that answers slowly is not dead. Requests never mark an upstream down but for
        a refused connection (gateway.proxy), so one slow request cannot take it out for everyone."""
        timeout = max(1.0, min(2.0, self.settings.health_interval_s * 2))
        try:
            await self._probe(state, timeout)
            state.failed_checks = 0
            state.mark_up()
        except httpx.ConnectError as exc:
            state.mark_down(f"health check: {type(exc).__name__}: {exc}"[:200])
        except (httpx.HTTPError, UnhealthyAnswer) as exc:
            state.failed_checks += 1
            if state.failed_checks >= FAILED_CHECKS_DOWN:
                why = str(exc) if isinstance(exc, UnhealthyAnswer) else type(exc).__name__
                state.mark_down(f"health check: {state.failed_checks} failures in a row (last: {why})"[:200])
        state.checked_at = time.time()

    async def _probe(self, state: UpstreamState, timeout: float) -> None:
        """/health (UnhealthyAnswer unless 200), then /metrics for the upstream's load."""
        health = await self.http.get(f"{state.upstream.url}/health", timeout=timeout)
        if health.status_code != 200:
            raise UnhealthyAnswer(f"/health answered {health.status_code}")
        metrics = await self.http.get(f"{state.upstream.url}/metrics", timeout=timeout)
        if metrics.status_code == 200:
            state.read_metrics(metrics.text)

    # -- bookkeeping -------------------------------------------------------------------------------

    def finish(self, outcome: Outcome, t0: float, state: UpstreamState | None) -> RequestRecord:
        """The request's record, handed to the sink; its upstream (None: none took it) freed."""
        outcome.e2e_s = time.monotonic() - t0
        if state is not None:
            state.in_flight -= 1
            outcome.device_s = state.sharing.leave(outcome.shared_from)
            state.served[outcome.status] = state.served.get(outcome.status, 0) + 1
        record = outcome.record(self.settings.name)
        self.sink.put(record)
        if outcome.capture is not None and outcome.output_text is not None:  # captures on (telemetry.capture)
            prompt, kind = outcome.capture
            self.sink.capture(record, prompt, outcome.output_text, kind)
        return record


def _describe(state: UpstreamState) -> dict:
    upstream = state.upstream
    reason = None if state.healthy else (state.last_error or "down")[:80]
    return {
        "name": upstream.name,
        "url": upstream.url[:120],
        "pool": upstream.pool,
        "drafter": upstream.drafter,
        "healthy": state.healthy,
        "reason": reason,
    }
