"""Issue 30 #5: connections that never finish their request headers are closed after the header
deadline (uvicorn alone kept 500 of them open for 30 s and more); requests in progress are not cut."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import httpx
import pytest
import uvicorn
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from specwatch.common.procs import free_port
from specwatch.common.serving import header_deadline

DEADLINE_S = 0.3


async def slow(request) -> PlainTextResponse:
    await asyncio.sleep(3 * DEADLINE_S)  # longer than the header deadline: a request in progress is not cut
    return PlainTextResponse("done")


@pytest.fixture(params=[H11Protocol, HttpToolsProtocol], ids=["h11", "httptools"])
def server(request):
    port = free_port()
    app = Starlette(routes=[Route("/slow", slow)])
    protocol = header_deadline(request.param, DEADLINE_S)
    server = uvicorn.Server(uvicorn.Config(app, port=port, log_level="warning", http=protocol, lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    yield port
    server.should_exit = True
    thread.join(timeout=10)


def closed_within(conn: socket.socket, seconds: float) -> bool:
    conn.settimeout(seconds)
    try:
        return conn.recv(1024) == b""
    except TimeoutError:
        return False
    except ConnectionResetError:
        return True


def test_connections_with_unfinished_headers_are_closed(server):
    conns = [socket.create_connection(("127.0.0.1", server)) for _ in range(50)]
    try:
        for i, conn in enumerate(conns):
            if i % 2:
                conn.sendall(b"GET /slow HTTP/1.1\r\nhost: x\r\n")  # headers never finished
        started = time.monotonic()
        assert all(closed_within(conn, 5.0) for conn in conns)
        assert time.monotonic() - started < 2.0
    finally:
        for conn in conns:
            conn.close()


def test_a_slow_request_and_a_kept_alive_connection_are_not_cut(server):
    with httpx.Client(base_url=f"http://127.0.0.1:{server}", timeout=10) as client:
        assert client.get("/slow").text == "done"
        assert client.get("/slow").text == "done"  # the same connection, kept alive between the two
