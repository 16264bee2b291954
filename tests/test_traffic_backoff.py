"""The traffic generator backs off while its target fails and gives up after a bounded run of failures."""

from __future__ import annotations

import asyncio
import io
import json
import threading
import time
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from specwatch.common.procs import free_port
from specwatch.traffic import TrafficConfig, run_traffic


def config(url: str, **changes) -> TrafficConfig:
    return TrafficConfig(**{"url": url, "scenarios": ("chat",), "max_requests": 30, "concurrency": 2} | changes)


def test_a_refused_target_is_given_up_after_a_few_backed_off_attempts():
    progress = io.StringIO()
    started = time.monotonic()
    tally = asyncio.run(run_traffic(config(f"http://127.0.0.1:{free_port()}", max_failures=6), progress=progress))
    elapsed = time.monotonic() - started
    assert len(tally.outcomes) <= 7 and all(o.error == "ConnectError" for o in tally.outcomes)
    assert 1.0 < elapsed < 10  # the pauses 0.1 + 0.2 + 0.4 + 0.8 s ...: no spinning
    assert tally.stopped and "stopped after 6 consecutive failures" in tally.stopped
    assert progress.getvalue().count("consecutive failures") == 1


def test_failing_for_longer_than_give_up_s_ends_the_run():
    tally = asyncio.run(run_traffic(config(f"http://127.0.0.1:{free_port()}", give_up_s=1.0), progress=io.StringIO()))
    assert tally.stopped and len(tally.outcomes) <= 8


def test_a_target_that_answers_503_then_recovers_gets_the_whole_run():
    with answering(failures=4) as seen:
        progress = io.StringIO()
        tally = asyncio.run(run_traffic(config(seen["url"], max_requests=12, max_failures=6), progress=progress))
    assert tally.stopped is None and "consecutive failures" not in progress.getvalue()
    assert [o.error for o in tally.outcomes if not o.ok] == ["HTTP 503"] * 4
    assert sum(o.ok for o in tally.outcomes) == 8 and seen["requests"] == 12


@contextmanager
def answering(failures: int):
    """A real HTTP server on loopback: 503 for the first `failures` requests, then a streamed completion."""
    seen = {"requests": 0}

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["Content-Length"]))
            seen["requests"] += 1
            if seen["requests"] <= failures:
                self.send_error(503, "busy")
                return
            chunk = {"choices": [{"delta": {"content": "hi"}}], "usage": {"completion_tokens": 1}}
            body = f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    seen["url"] = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        yield seen
    finally:
        server.shutdown()
        server.server_close()
