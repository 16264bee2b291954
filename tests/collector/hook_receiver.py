"""A real local webhook receiver for the replica tests: records every POST (headers, JSON body)."""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class HookReceiver:
    """An HTTP server on 127.0.0.1:port answering 200 to every POST after `delay_s` (so that
    concurrent deliverers overlap), recording (headers, parsed body) in arrival order."""

    def __init__(self, port: int, delay_s: float = 0.0) -> None:
        self.received: list[tuple[dict, dict]] = []
        received, lock = self.received, threading.Lock()

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's naming
                body = self.rfile.read(int(self.headers["Content-Length"]))
                time.sleep(delay_s)
                with lock:
                    received.append((dict(self.headers), json.loads(body)))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
