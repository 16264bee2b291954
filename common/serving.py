"""uvicorn as all three servers (engine, gateway, collector) run it: with a deadline on request headers.

uvicorn 0.54 times out an idle kept-alive connection (`timeout_keep_alive`) but not one that never
finishes its headers: 500 such half-open connections stayed open 30 s and more (issue 30 #5). Its
HTTP protocol classes are subclassed here: from the moment a connection opens, and again each time a
response completes, the next request's headers must arrive within `HEADER_TIMEOUT_S` or the
connection is closed. Request bodies have their own deadline in each server (the collector's and the
gateway's body timeout, `common.bodies`).
"""

from __future__ import annotations

import asyncio

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

HEADER_TIMEOUT_S = 10.0  # whole request headers within this, from connect or from the previous response
KEEP_ALIVE_S = 5.0  # an idle kept-alive connection is closed after this (uvicorn's own timer)


def header_deadline(base: type, timeout_s: float) -> type:
    """`base` (an uvicorn HTTP protocol class) closing a connection whose request headers are late."""

    class HeaderDeadline(base):
        _header_timer: asyncio.TimerHandle | None = None

        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self._arm_header_timer()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm_header_timer()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm_header_timer()
            super().connection_lost(exc)

        def _arm_header_timer(self) -> None:
            self._disarm_header_timer()
            self._header_timer = self.loop.call_later(timeout_s, self._headers_late)

        def _disarm_header_timer(self) -> None:
            if self._header_timer is not None:
                self._header_timer.cancel()
                self._header_timer = None

        def _headers_late(self) -> None:
            """No request in progress (none yet, or the last one answered): its headers never came."""
            self._header_timer = None
            if (self.cycle is None or self.cycle.response_complete) and not self.transport.is_closing():
                self.transport.close()

    HeaderDeadline.__name__ = f"HeaderDeadline{base.__name__}"
    return HeaderDeadline


def http_protocol(timeout_s: float = HEADER_TIMEOUT_S) -> type:
    """uvicorn's faster httptools protocol when installed, else h11, with the header deadline."""
    try:
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
    except ImportError:
        return header_deadline(H11Protocol, timeout_s)
    return header_deadline(HttpToolsProtocol, timeout_s)


def config(app, host: str, port: int, header_timeout_s: float = HEADER_TIMEOUT_S, **options) -> uvicorn.Config:
    """An uvicorn.Config with the header deadline and the keep-alive timeout set; `options` as uvicorn's."""
    options.setdefault("timeout_keep_alive", KEEP_ALIVE_S)
    return uvicorn.Config(app, host=host, port=port, http=http_protocol(header_timeout_s), **options)


def run(app, host: str, port: int, header_timeout_s: float = HEADER_TIMEOUT_S, **options) -> None:
    """uvicorn.run with the header deadline and the keep-alive timeout (`options` as uvicorn.run's)."""
    options.setdefault("timeout_keep_alive", KEEP_ALIVE_S)
    uvicorn.run(app, host=host, port=port, http=http_protocol(header_timeout_s), **options)
