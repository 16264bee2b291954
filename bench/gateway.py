"""Gateway overhead: requests sent directly to an upstream vs through `specwatch gateway serve`, side by side
in one run, at concurrency 1 and 8, whole responses and SSE streams.

    .venv/bin/python bench/gateway.py [--upstream {engine,instant,URL} ...] [--rounds R] [--requests N]
                                      [--gateway-cpu N]

Goals (the gateway issue): overhead p50 <= 2 ms per request, throughput >= 0.95x direct.

Upstreams (default: instant, then engine):
  * instant - an OpenAI-compatible server in this file (a child process) that answers at once with a fixed
    vLLM-shaped body (per-request metrics with an n-gram acceptance histogram) or an SSE stream of
    --chunks content chunks + the usage chunk. Its answer costs ~nothing, so what it measures is the
    proxy's own cost: that is the row to judge the 2 ms goal on. Its throughput ratio is a worst case:
    the upstream does no work, so the gateway's CPU is the whole cost of a request, and client, gateway
    and upstream share this machine's cores.
  * engine  - the bundled engine (`specwatch engine serve`, SmolLM2-135M), greedy, --max-tokens tokens.
    Its run-to-run noise on a small CPU machine (~ms) is larger than the 2 ms goal.
  * a URL   - any running OpenAI-compatible server (e.g. vLLM), its first /v1/models entry.

Each upstream gets three gateways in front of it: one without telemetry, one sending a RequestRecord
per request to a real collector (`specwatch collector serve`, temporary SQLite) started here, and one
with spans on (telemetry.spans: OTEL_EXPORTER_OTLP_ENDPOINT set) exporting a span per request over
OTLP/HTTP protobuf to a local receiver (an instant server's /v1/traces, which counts and drops them). A round
sends the same request set (--requests requests by --concurrency workers, one httpx.AsyncClient per
target in this process) directly, through the gateway and through the gateway with telemetry, in an
order that rotates from round to round; round 0 (2 x concurrency requests) warms up and is discarded.
Per target and round: p50 end-to-end latency (streams: also p50 time to the first content chunk) and
requests/s over the round.
Overhead = median over rounds of (p50 via the gateway - p50 direct in the same round); throughput
ratio = median over rounds of (gateway req/s / direct req/s in the same round).
Every round is printed; the table and the verdict come last, and bench/results/gateway.json holds it all.
The exit code is 0 whatever the verdict (a benchmark, not a test).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import signal
import sqlite3
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402
import orjson  # noqa: E402

from specwatch.common import procs  # noqa: E402

GOAL_OVERHEAD_MS = 2.0
GOAL_THROUGHPUT = 0.95
TARGETS = ("direct", "gateway", "gateway+telemetry", "gateway+spans")
SPAN_VARIABLES = ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
ISOLATED_ENV = ("SPECWATCH_COLLECTOR_URL", "SPECWATCH_INGEST_TOKEN", "SPECWATCH_CONTROL_TOKEN", *SPAN_VARIABLES)
PROMPT = "Repeat after me: the quick brown fox jumps over the lazy dog."


# -- the instant upstream (runs as a child process: `bench/gateway.py --serve-instant PORT`) ----------------


def instant_app(chunks: int):
    """A minimal vLLM look-alike that answers at once: /v1/chat/completions (whole or SSE), /health,
    /metrics (running/waiting gauges the gateway scrapes for load) and /v1/models."""
    from starlette.applications import Starlette
    from starlette.responses import Response, StreamingResponse
    from starlette.routing import Route

    running = 0
    spec = {
        "mean_acceptance_length": 3.0,
        "draft_acceptance_rate": 0.5,
        "acceptance_histogram": [1, 1, 1, 1, 0],
        "num_spec_steps": 4,
        "num_accepted_draft_tokens": 6,
        "num_draft_tokens": 16,
        "num_spec_tokens": 4,
    }
    metrics = {"time_to_first_token_ms": 1.0, "generation_time_ms": 1.0, "queue_time_ms": 0.1, "mean_itl_ms": 0.1}
    metrics |= {"tokens_per_second": 1000.0, "speculative_decoding": spec}
    usage = {"prompt_tokens": 20, "completion_tokens": chunks, "total_tokens": 20 + chunks}
    head = {"id": "chatcmpl-instant", "created": 1796091871, "model": "instant"}
    whole = orjson.dumps(
        {
            **head,
            "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": " word" * chunks}}],
            "usage": usage,
            "metrics": metrics,
        }
    )

    def event(payload: dict) -> bytes:
        return b"data: " + orjson.dumps({**head, "object": "chat.completion.chunk", **payload}) + b"\n\n"

    content = [event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})]
    content += [event({"choices": [{"index": 0, "delta": {"content": " word"}}]}) for _ in range(chunks)]
    usage_event = event({"choices": [], "usage": usage, "metrics": metrics})

    async def chat(request):
        nonlocal running
        body = orjson.loads(await request.body())
        if not body.get("stream"):
            return Response(whole, media_type="application/json")
        tail = [usage_event] if (body.get("stream_options") or {}).get("include_usage") else []

        async def events():
            nonlocal running
            running += 1
            try:
                for item in [*content, *tail, b"data: [DONE]\n\n"]:
                    yield item
            finally:
                running -= 1

        return StreamingResponse(events(), media_type="text/event-stream")

    received = 0

    async def traces(request):  # an OTLP/HTTP receiver that counts the spans and drops them
        nonlocal received
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        export = ExportTraceServiceRequest.FromString(await request.body())
        received += sum(len(s.spans) for r in export.resource_spans for s in r.scope_spans)
        return Response(b"", media_type="application/x-protobuf")

    def gauges(request):
        text = f"vllm:num_requests_running {running}\nvllm:num_requests_waiting 0\n"
        return Response(text, media_type="text/plain")

    routes = [
        Route("/v1/chat/completions", chat, methods=["POST"]),
        Route("/health", lambda request: Response(b""), methods=["GET"]),
        Route("/metrics", gauges, methods=["GET"]),
        Route("/v1/traces", traces, methods=["POST"]),
        Route("/v1/traces/received", lambda request: Response(orjson.dumps(received)), methods=["GET"]),
        Route("/v1/models", lambda request: Response(orjson.dumps({"data": [{"id": "instant"}]})), methods=["GET"]),
    ]
    return Starlette(routes=routes)


def serve_instant(port: int, chunks: int) -> None:
    import uvicorn

    uvicorn.run(instant_app(chunks), host="127.0.0.1", port=port, log_level="warning", access_log=False)


# -- services -------------------------------------------------------------------------------------------------


@dataclass
class Services:
    """The children this run started, stopped in reverse order by `stop_all` (also on Ctrl-C)."""

    workdir: Path
    gateway_cpu: int | None = None  # pin the gateways to this core (everything else runs on the others)
    processes: list = field(default_factory=list)

    spans_url: str = ""  # the OTLP/HTTP receiver of the gateway with spans on

    def start(self, name: str, cmd: list[str], ready_path: str, port: int, timeout_s: float = 60.0, **env) -> str:
        env = {k: v for k, v in procs.child_env().items() if k not in ISOLATED_ENV} | env
        url = f"http://127.0.0.1:{port}"
        log = self.workdir / f"{name}.log"
        process = procs.start_service(name, cmd, env, log, url + ready_path, timeout_s)
        if self.gateway_cpu is not None and name.startswith("gateway"):
            os.sched_setaffinity(process.pid, {self.gateway_cpu})
        self.processes.append((name, process))
        return url

    def stop(self, name: str) -> None:
        for entry in [e for e in self.processes if e[0] == name]:
            procs.stop_process(entry[1], timeout_s=15)
            self.processes.remove(entry)

    def stop_all(self) -> None:
        while self.processes:
            name, process = self.processes.pop()
            procs.stop_process(process, timeout_s=15)


def start_instant(services: Services, name: str, chunks: int) -> str:
    port = procs.free_port()
    cmd = [sys.executable, str(Path(__file__).resolve()), "--serve-instant", str(port), "--chunks", str(chunks)]
    return services.start(name, cmd, "/health", port)


def start_upstream(services: Services, kind: str, args) -> str:
    if kind == "instant":
        return start_instant(services, "instant", args.chunks)
    if kind == "engine":
        port = procs.free_port()
        cmd = procs.specwatch_command(
            "engine", "serve", "--port", str(port), "--instance", "bench-engine", "--spool-dir", str(services.workdir)
        )
        return services.start("engine", cmd, "/health", port, timeout_s=180)
    return kind.rstrip("/")


def start_gateways(services: Services, kind: str, upstream_url: str, collector_url: str) -> dict[str, str]:
    """Three gateways in front of the upstream: without telemetry, with it to the collector, with spans on."""
    spec = ",drafter=ngram,gamma=4" if kind == "instant" else ""  # instant's metrics carry an n-gram histogram
    urls = {"direct": upstream_url}
    spans = {"OTEL_EXPORTER_OTLP_ENDPOINT": services.spans_url}
    for target, telemetry, env in (
        ("gateway", [], {}),
        ("gateway+telemetry", ["--collector", collector_url], {}),
        ("gateway+spans", [], spans),
    ):
        port = procs.free_port()
        name = f"gateway-{kind_label(kind)}" + target.removeprefix("gateway").replace("+", "-")
        cmd = procs.specwatch_command(
            "gateway", "serve", "--upstream", f"up={upstream_url}{spec}", "--port", str(port), *telemetry,
            "--spool-dir", str(services.workdir / f"{name}-spool"),
        )  # fmt: skip
        urls[target] = services.start(name, cmd, "/health", port, **env)
    return urls


def kind_label(kind: str) -> str:
    return kind if kind in ("engine", "instant") else "url"


# -- the client -----------------------------------------------------------------------------------------------


@dataclass
class Timing:
    e2e_s: float
    first_chunk_s: float | None
    ok: bool


async def one_request(client: httpx.AsyncClient, url: str, raw: bytes, stream: bool) -> Timing:
    """One request; a transport error (e.g. a keep-alive connection the server closed) counts as an error."""
    started = time.perf_counter()
    try:
        return await _timed(client, url, raw, stream, started)
    except httpx.HTTPError as exc:
        print(f"      {url}: {type(exc).__name__}: {exc}", flush=True)
        return Timing(time.perf_counter() - started, None, False)


async def _timed(client: httpx.AsyncClient, url: str, raw: bytes, stream: bool, started: float) -> Timing:
    if not stream:
        response = await client.post(url, content=raw, headers={"content-type": "application/json"})
        ok = response.status_code == 200 and b'"choices"' in response.content
        return Timing(time.perf_counter() - started, None, ok)
    first, buffer = None, b""
    async with client.stream("POST", url, content=raw, headers={"content-type": "application/json"}) as response:
        async for data in response.aiter_raw():
            buffer += data
            if first is None and _has_content(buffer):
                first = time.perf_counter() - started
        ok = response.status_code == 200 and buffer.rstrip().endswith(b"data: [DONE]")
    return Timing(time.perf_counter() - started, first, ok and first is not None)


def _has_content(buffer: bytes) -> bool:
    """True once a complete SSE event in `buffer` has a non-empty delta content (the first token)."""
    for event in buffer.split(b"\n\n")[:-1]:
        if event.startswith(b"data: {"):
            chunk = orjson.loads(event[6:])
            if any((c.get("delta") or {}).get("content") for c in chunk.get("choices") or []):
                return True
    return False


async def burst(client: httpx.AsyncClient, url: str, raw: bytes, stream: bool, requests: int, concurrency: int):
    """`requests` requests by `concurrency` workers; (samples, wall seconds)."""
    samples: list[Timing] = []
    todo = iter(range(requests))

    async def worker() -> None:
        for _ in todo:
            samples.append(await one_request(client, url, raw, stream))

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return samples, time.perf_counter() - started


def summarize(samples: list[Timing], wall_s: float) -> dict:
    good = [s for s in samples if s.ok]
    firsts = [s.first_chunk_s for s in good if s.first_chunk_s is not None]
    return {
        "p50_ms": median(s.e2e_s for s in good) * 1000 if good else None,
        "first_chunk_p50_ms": median(firsts) * 1000 if firsts else None,
        "rps": len(good) / wall_s,
        "errors": len(samples) - len(good),
    }


# -- one cell: upstream x stream/whole x concurrency -------------------------------------------------------------


async def measure_cell(clients: dict, urls: dict, body: dict, stream: bool, concurrency: int, args) -> list[dict]:
    raw = orjson.dumps({**body, "stream": stream})
    path = "/v1/chat/completions"
    rounds = []
    for number in range(args.rounds + 1):  # round 0 warms up (connections, code paths) and is discarded
        shift = number % len(TARGETS)
        order = TARGETS[shift:] + TARGETS[:shift]
        requests = args.requests if number else min(args.requests, 2 * concurrency)
        measured = {}
        for target in order:
            samples, wall = await burst(clients[target], urls[target] + path, raw, stream, requests, concurrency)
            measured[target] = summarize(samples, wall)
        if number:
            rounds.append({"round": number, "order": list(order), **measured})
            print_round(stream, concurrency, number, measured)
    return rounds


def print_round(stream: bool, concurrency: int, number: int, measured: dict) -> None:
    parts = []
    for target, m in measured.items():
        first = f" first {m['first_chunk_p50_ms']:.2f}" if m["first_chunk_p50_ms"] is not None else ""
        errors = f" ERRORS {m['errors']}" if m["errors"] else ""
        parts.append(f"{target} p50 {_ms(m['p50_ms'])}{first} {m['rps']:.1f} req/s{errors}")
    print(f"    {'stream' if stream else 'whole':<6} c={concurrency} round {number}: " + " | ".join(parts), flush=True)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def cell_row(label: str, stream: bool, concurrency: int, target: str, rounds: list[dict]) -> dict:
    """The table row of one gateway target against direct, over the cell's rounds."""

    def per_round(key: str) -> list[float]:
        pairs = [(r[target][key], r["direct"][key]) for r in rounds]
        return [g - d for g, d in pairs if g is not None and d is not None]

    overhead, first_overhead = per_round("p50_ms"), per_round("first_chunk_p50_ms")
    ratios = [r[target]["rps"] / r["direct"]["rps"] for r in rounds if r["direct"]["rps"]]
    row = {
        "upstream": label,
        "response": "stream" if stream else "whole",
        "concurrency": concurrency,
        "via": target,
        "p50_direct_ms": median(r["direct"]["p50_ms"] for r in rounds if r["direct"]["p50_ms"] is not None),
        "p50_gateway_ms": median(r[target]["p50_ms"] for r in rounds if r[target]["p50_ms"] is not None),
        "overhead_p50_ms": median(overhead) if overhead else None,
        "first_chunk_overhead_p50_ms": median(first_overhead) if first_overhead else None,
        "throughput_ratio": median(ratios) if ratios else None,
        "errors": sum(r[target]["errors"] + r["direct"]["errors"] for r in rounds),
    }
    row["overhead_ok"] = row["overhead_p50_ms"] is not None and row["overhead_p50_ms"] <= GOAL_OVERHEAD_MS
    row["throughput_ok"] = row["throughput_ratio"] is not None and row["throughput_ratio"] >= GOAL_THROUGHPUT
    return row


# -- one upstream ----------------------------------------------------------------------------------------------


async def model_of(url: str) -> str:
    async with httpx.AsyncClient(trust_env=False) as client:
        response = await client.get(url + "/v1/models", timeout=10)
        response.raise_for_status()
        return response.json()["data"][0]["id"]


async def measure_upstream(label: str, urls: dict, args) -> tuple[list[dict], dict]:
    body = {
        "model": await model_of(urls["direct"]),
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": args.max_tokens,
        "temperature": 0,
    }
    limits = httpx.Limits(max_connections=64, max_keepalive_connections=64)
    rows, raw_rounds = [], {}
    async with contextlib.AsyncExitStack() as stack:
        clients = {
            t: await stack.enter_async_context(httpx.AsyncClient(limits=limits, timeout=120, trust_env=False))
            for t in TARGETS
        }
        for stream in (False, True):
            for concurrency in args.concurrency:
                rounds = await measure_cell(clients, urls, body, stream, concurrency, args)
                raw_rounds[f"{'stream' if stream else 'whole'}/c{concurrency}"] = rounds
                rows += [cell_row(label, stream, concurrency, target, rounds) for target in TARGETS[1:]]
    return rows, raw_rounds


def upstream_label(kind: str) -> str:
    if kind == "instant":
        return "instant (proxy cost only)"
    return "engine (SmolLM2-135M)" if kind == "engine" else kind


def stored_records(db: Path, expected: int, timeout_s: float = 10.0) -> int:
    """Requests the collector has stored, once it holds `expected` or its count stops growing."""
    deadline, last = time.monotonic() + timeout_s, -1
    while True:
        with contextlib.closing(sqlite3.connect(db)) as connection:
            count = connection.execute("SELECT count(*) FROM requests").fetchone()[0]
        if count >= expected or count == last or time.monotonic() > deadline:
            return count
        last = count
        time.sleep(1.0)


def run_upstream(kind: str, services: Services, collector_url: str, args) -> tuple[list[dict], dict, int]:
    """The rows and rounds of one upstream, and how many requests went through the telemetry gateway."""
    label = upstream_label(kind)
    print(f"\n== upstream: {label}", flush=True)
    started = time.monotonic()
    upstream_url = start_upstream(services, kind, args)
    urls = start_gateways(services, kind, upstream_url, collector_url)
    print(f"   started in {time.monotonic() - started:.1f} s: " + ", ".join(f"{k} {v}" for k, v in urls.items()))
    rows, rounds = asyncio.run(measure_upstream(label, urls, args))
    for name in [n for n, _ in services.processes if n.startswith("gateway-") or n == kind]:
        services.stop(name)  # the gateways flush their telemetry on SIGTERM
    per_cell = [args.rounds * args.requests + min(args.requests, 2 * c) for c in args.concurrency]
    return rows, rounds, 2 * sum(per_cell)  # per gateway: whole and stream cells


# -- report ------------------------------------------------------------------------------------------------------


def print_table(rows: list[dict]) -> None:
    print(
        f"\n{'upstream':<26} {'resp':<6} {'c':>2} {'via':<18} {'p50 direct':>10} {'p50 gw':>8} "
        f"{'overhead':>8} {'1st-chunk':>9} {'thru gw/dir':>11} {'overhead<=2ms':>13} {'thru>=0.95x':>11}"
    )
    for r in rows:
        print(
            f"{r['upstream']:<26} {r['response']:<6} {r['concurrency']:>2} {r['via']:<18} "
            f"{_ms(r['p50_direct_ms']):>10} {_ms(r['p50_gateway_ms']):>8} {_ms(r['overhead_p50_ms']):>8} "
            f"{_ms(r['first_chunk_overhead_p50_ms']):>9} {_ratio(r['throughput_ratio']):>11} "
            f"{_verdict(r['overhead_ok']):>13} {_verdict(r['throughput_ok']):>11}"
            + (f"  ({r['errors']} errors)" if r["errors"] else "")
        )
    print("(ms; overhead = median over rounds of p50 via gateway - p50 direct in the same round; 1st-chunk: the same")
    print(" for the time to the first content chunk of a stream; thru = median over rounds of the req/s ratio)")


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}x"


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def print_verdict(rows: list[dict]) -> dict:
    verdict = {}
    for goal, key in (("overhead p50 <= 2 ms", "overhead_ok"), ("throughput >= 0.95x direct", "throughput_ok")):
        failed = [f"{r['upstream']} {r['response']} c={r['concurrency']} {r['via']}" for r in rows if not r[key]]
        verdict[goal] = {"pass": not failed, "failed": failed}
        print(f"{goal}: {'PASS' if not failed else 'FAIL'} ({len(rows) - len(failed)}/{len(rows)} rows pass)")
        for name in failed:
            print(f"    failed: {name}")
    return verdict


def report(rows: list[dict], rounds: dict, telemetry: dict, load: dict, path: Path) -> None:
    print_table(rows)
    print(
        f"telemetry: {telemetry['stored']} RequestRecords stored by the collector of {telemetry['sent']} "
        "sent through the telemetry gateway"
    )
    print(f"spans: {telemetry['spans_received']} received over OTLP/HTTP of {telemetry['sent']} requests sent")
    print(
        f"machine: {os.cpu_count()} CPUs, {load['placement']}; "
        f"1-min load average {load['start']:.1f} at start, {load['end']:.1f} at end"
    )
    verdict = print_verdict(rows)
    results = {"rows": rows, "rounds": rounds, "verdict": verdict, "telemetry": telemetry}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**results, "load_average_1m": load, "cpus": os.cpu_count()}, indent=2))
    print(f"results: {path}")


# -- main --------------------------------------------------------------------------------------------------------


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--upstream",
        action="append",
        default=None,
        metavar="{engine,instant,URL}",
        help="upstream(s) to measure (repeat; default: instant and engine)",
    )
    parser.add_argument(
        "--rounds", type=int, default=None, help="measured rounds per cell (default: instant 5, else 3)"
    )
    parser.add_argument(
        "--requests", type=int, default=None, help="requests per target per round (default: instant 100, else 8)"
    )
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--max-tokens", type=int, default=16, help="max_tokens of each request (default: 16)")
    parser.add_argument("--chunks", type=int, default=16, help="content chunks of the instant upstream's streams")
    parser.add_argument("--json", type=Path, default=REPO / "bench" / "results" / "gateway.json")
    parser.add_argument(
        "--gateway-cpu",
        type=int,
        default=None,
        help="pin the gateways to this core and the client, upstream and collector to the others, as a gateway "
        "on its own host would run (default: all share every core)",
    )
    parser.add_argument("--serve-instant", type=int, metavar="PORT", help=argparse.SUPPRESS)
    args = parser.parse_args()
    cores = os.sched_getaffinity(0)
    if args.gateway_cpu is not None and (args.gateway_cpu not in cores or len(cores) < 2):
        parser.error(f"--gateway-cpu: needs one of the cores {sorted(cores)} and at least one other left")
    for kind in args.upstream or []:
        if kind not in ("engine", "instant") and not kind.startswith(("http://", "https://")):
            parser.error(f"--upstream: {kind!r} is not engine, instant or an http(s):// URL")
    if min([*args.concurrency, args.rounds or 1, args.requests or 1, args.max_tokens, args.chunks]) < 1:
        parser.error("--concurrency, --rounds, --requests, --max-tokens and --chunks must be >= 1")
    return args


def with_defaults(args: argparse.Namespace, kind: str) -> argparse.Namespace:
    instant = kind == "instant"
    rounds = args.rounds or (5 if instant else 3)
    requests = args.requests or (100 if instant else 8)
    return argparse.Namespace(**{**vars(args), "rounds": rounds, "requests": requests})


def main() -> int:
    args = parse_args()
    if args.serve_instant:
        serve_instant(args.serve_instant, args.chunks)
        return 0
    sys.stdout.reconfigure(line_buffering=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the children on SIGTERM too, not only Ctrl-C
    kinds = args.upstream or ["instant", "engine"]
    placement = "all shared by client, gateways and upstream (and anything else running)"
    if args.gateway_cpu is not None:
        placement = f"gateways pinned to core {args.gateway_cpu}, client, upstream and collector to the others"
    rows, rounds, sent, load = [], {}, 0, {"start": os.getloadavg()[0], "placement": placement}
    if args.gateway_cpu is not None:  # this process (the client) and every child but the gateways
        os.sched_setaffinity(0, os.sched_getaffinity(0) - {args.gateway_cpu})
        print(
            f"gateways on core {args.gateway_cpu}; client, upstream and collector on {sorted(os.sched_getaffinity(0))}"
        )
    with tempfile.TemporaryDirectory(prefix="bench-gateway-") as tmp:
        services = Services(Path(tmp), args.gateway_cpu)
        try:
            db = Path(tmp) / "collector.db"
            port = procs.free_port()
            collector = services.start(
                "collector",
                procs.specwatch_command("collector", "serve", "--port", str(port), "--db", f"sqlite:///{db}"),
                "/readyz",
                port,
            )
            services.spans_url = start_instant(services, "otlp-receiver", 1)
            print(f"collector {collector} (SQLite {db}), OTLP receiver {services.spans_url}; 3 gateways per upstream")
            for kind in kinds:
                kind_rows, kind_rounds, kind_sent = run_upstream(kind, services, collector, with_defaults(args, kind))
                rows, sent = rows + kind_rows, sent + kind_sent
                rounds[upstream_label(kind)] = kind_rounds
            stored = stored_records(db, sent)
            spans = httpx.get(services.spans_url + "/v1/traces/received", timeout=10).json()
        finally:
            services.stop_all()
    load["end"] = os.getloadavg()[0]
    report(rows, rounds, {"sent": sent, "stored": stored, "spans_received": spans}, load, args.json)
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
