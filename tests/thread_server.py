"""Any ASGI app under uvicorn on a free loopback port in a daemon thread (the engine's and the
gateway's test harnesses, the benches)."""

from __future__ import annotations

import threading
import time

import uvicorn

from specwatch.common.procs import free_port


class ThreadServer:
    """Any ASGI app under uvicorn in a daemon thread."""

    def __init__(self, app) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, port=self.port, log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        if not self.server.started:
            raise RuntimeError(f"server did not start on {self.url}")
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
