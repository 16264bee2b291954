"""Serving until SIGTERM/SIGINT, then a graceful shutdown with a deadline.

uvicorn stops accepting and waits for in-flight requests. At the deadline the scheduler cancels
what is still running or queued: each running request is recorded `cancelled` and its waiting
client is answered 503, so every connection ends cleanly. uvicorn's own cancellation of the
request tasks (a traceback each, and no response) is only the backstop a few seconds later.
"""

from __future__ import annotations

import asyncio
import signal

import uvicorn

from specwatch.common import serving

BACKSTOP_S = 5.0  # after the deadline, for the scheduler's last round and the 503 answers


class _Server(uvicorn.Server):
    def __init__(self, config: uvicorn.Config, scheduler, deadline_s: float) -> None:
        super().__init__(config)
        self.scheduler, self.deadline_s = scheduler, deadline_s

    async def shutdown(self, sockets=None) -> None:
        loop = asyncio.get_running_loop()
        # stop() waits for the scheduler's current round: off the event loop, which delivers the answers
        deadline = loop.call_later(self.deadline_s, loop.run_in_executor, None, self.scheduler.stop)
        try:
            await super().shutdown(sockets)
        finally:
            deadline.cancel()


def serve_until_signal(app, scheduler, host: str, port: int, shutdown_timeout_s: float) -> None:
    """Serve `app` until SIGTERM/SIGINT; return once in-flight work finished or was cancelled."""
    config = serving.config(  # with a request-header deadline (common.serving)
        app, host, port, log_level="warning", timeout_graceful_shutdown=shutdown_timeout_s + BACKSTOP_S
    )
    # uvicorn raises the signal it shut down for again once it is done; handled here, it lets the
    # caller flush its telemetry and exit 0 instead of dying by the signal
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: None)
    _Server(config, scheduler, shutdown_timeout_s).run()
