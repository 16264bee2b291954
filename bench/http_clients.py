"""Why the gateway sends proxied requests through aiohttp: CPU per request of httpx and aiohttp, side by side.

    .venv/bin/python bench/http_clients.py [--requests 1500] [--rounds 3]

Both clients send the same pre-serialised chat body to bench/gateway.py's instant upstream (a child
process that answers at once: a whole vLLM-shaped JSON answer, or an SSE stream of 16 content chunks)
and read the whole answer, one request at a time, the way gateway.proxy does (the response body read
as it arrives, then released). Rounds alternate the clients; the figure is this process's CPU time
(time.process_time) per request, whose median over rounds is printed with the ratio httpx / aiohttp.
CPU time, not latency: it is what the clients cost the gateway's one core, and it is far less
sensitive to other load on the machine than wall time (printed beside it).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import tempfile
import time
from pathlib import Path
from statistics import median

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import aiohttp  # noqa: E402
import httpx  # noqa: E402
import orjson  # noqa: E402

from specwatch.common import procs  # noqa: E402

HEADERS = {"content-type": "application/json"}


def body(stream: bool) -> bytes:
    messages = [{"role": "user", "content": "Repeat after me: the quick brown fox."}]
    return orjson.dumps({"model": "instant", "messages": messages, "max_tokens": 16, "stream": stream})


async def with_httpx(url: str, raw: bytes, n: int) -> None:
    async with httpx.AsyncClient(trust_env=False) as client:
        for _ in range(n):
            response = await client.send(client.build_request("POST", url, content=raw, headers=HEADERS), stream=True)
            async for _chunk in response.aiter_bytes():
                pass
            await response.aclose()


async def with_aiohttp(url: str, raw: bytes, n: int) -> None:
    async with aiohttp.ClientSession(cookie_jar=aiohttp.DummyCookieJar()) as session:
        for _ in range(n):
            response = await session.post(url, data=raw, headers=HEADERS)
            async for _chunk in response.content.iter_any():
                pass
            response.release()


CLIENTS = {"httpx": with_httpx, "aiohttp": with_aiohttp}


def measure(client, url: str, raw: bytes, n: int) -> tuple[float, float]:
    """(CPU ms, wall ms) per request of `n` requests."""
    cpu, wall = time.process_time(), time.perf_counter()
    asyncio.run(client(url, raw, n))
    return (time.process_time() - cpu) / n * 1000, (time.perf_counter() - wall) / n * 1000


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1500)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    if args.requests < 1 or args.rounds < 1:
        parser.error("--requests and --rounds must be at least 1")
    print(f"load average at start: {os.getloadavg()[0]:.2f}", flush=True)
    port = procs.free_port()
    cmd = [sys.executable, str(REPO / "bench" / "gateway.py"), "--serve-instant", str(port)]
    log = Path(tempfile.mkdtemp(prefix="bench-clients-")) / "instant.log"
    ready = f"http://127.0.0.1:{port}/health"
    upstream = procs.start_service("instant upstream", cmd, procs.child_env(), log, ready, 60)
    try:
        url = f"http://127.0.0.1:{port}/v1/chat/completions"
        for stream in (False, True):
            report("stream (16 chunks)" if stream else "whole answer", url, body(stream), args)
    finally:
        procs.stop_process(upstream, timeout_s=10)
    print(f"load average at end: {os.getloadavg()[0]:.2f}")
    return 0


def report(label: str, url: str, raw: bytes, args) -> None:
    measured: dict[str, list[tuple[float, float]]] = {name: [] for name in CLIENTS}
    for _ in range(args.rounds):
        for name, client in CLIENTS.items():
            measured[name].append(measure(client, url, raw, args.requests))
    cpu = {name: median(m[0] for m in runs) for name, runs in measured.items()}
    wall = {name: median(m[1] for m in runs) for name, runs in measured.items()}
    cells = "  ".join(f"{name} {cpu[name]:.3f} ms CPU ({wall[name]:.2f} ms wall)" for name in CLIENTS)
    print(f"{label:<20} {cells}  httpx/aiohttp CPU {cpu['httpx'] / cpu['aiohttp']:.2f}x", flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
