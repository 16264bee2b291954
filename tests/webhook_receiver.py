"""A real local webhook receiver for the alert, report and replica tests."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Receiver:
    """An HTTP server on 127.0.0.1:port recording every POST as (headers, body) in arrival order,
    answering `status` after `delay_s` (so that concurrent deliverers overlap)."""

    def __init__(self, port: int, status: int = 200, delay_s: float = 0.0) -> None:
        self.received: list[tuple[dict, bytes]] = []
        received, lock = self.received, threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers["Content-Length"]))
                time.sleep(delay_s)
                with lock:
                    received.append((dict(self.headers), body))
                self.send_response(status)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def bodies(self) -> list[dict]:
        """The JSON bodies received so far."""
        return [json.loads(body) for _, body in self.received]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
