"""A real collector for tests that need HTTP: uvicorn in a background thread on a free port."""

from __future__ import annotations

import threading
from contextlib import contextmanager

import uvicorn
from prometheus_client import CollectorRegistry
from waiting import wait_for

from specwatch.collector.settings import Settings
from specwatch.service.app import create_app


@contextmanager
def running_collector(settings: Settings, port: int, registry: CollectorRegistry | None = None):
    """A real collector (uvicorn) on 127.0.0.1:port in a background thread."""
    config = uvicorn.Config(create_app(settings, registry), host="127.0.0.1", port=port, log_level="warning")
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()

    def started() -> bool:
        assert thread.is_alive(), "collector did not start"
        return server.started

    wait_for(started, "the collector to start", timeout=20, interval=0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)
