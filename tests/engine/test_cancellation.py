"""Abandoned work is cancelled: a non-streaming request whose client left frees its slot, and SIGTERM
ends `specwatch engine serve` within its --shutdown-timeout, recording what it cut short `cancelled`
and answering its clients 503.

Generation is made long deterministically: greedy counting on the bundled model does not reach an
end-of-sequence token for thousands of tokens (about 10 tokens/s on a small CPU), so 2000 tokens
take minutes."""

from __future__ import annotations

import contextlib
import signal
import sqlite3
import subprocess
import threading
import time

import httpx
import orjson
import pytest
from waiting import wait_for

from specwatch.common.procs import child_env, free_port, specwatch_command, start_collector
from tests.engine.test_server import Server

COUNTING = {"prompt": "1, 2, 3, 4, 5, 6, 7, 8,", "max_tokens": 2000, "temperature": 0, "drafter": "none"}
CHAT_COUNTING = {
    "messages": [{"role": "user", "content": "Count from 1 to 5000, separated by commas, without stopping."}],
    "max_tokens": 2000,
    "temperature": 0,
    "drafter": "none",
}


@pytest.mark.parametrize("path,body", [("completions", COUNTING), ("chat/completions", CHAT_COUNTING)])
def test_an_abandoned_request_frees_its_slot_and_is_recorded_cancelled(bundled_engine, path, body):
    with Server(bundled_engine, slots=1) as server:
        with pytest.raises(httpx.TimeoutException):  # the client gives up after 1 s and closes its connection
            httpx.post(f"{server.url}/v1/{path}", json=body, timeout=1.0)
        wait_for(lambda: server.scheduler.active == 0, "the abandoned request's slot to be freed", timeout=2.0)
        record = wait_for(lambda: server.records and server.records[-1], "the abandoned request's record")
        assert record.status == "cancelled" and 0 < record.output_tokens < 2000
        short = httpx.post(f"{server.url}/v1/completions", json={**COUNTING, "max_tokens": 4}, timeout=30)
        assert short.status_code == 200 and server.records[-1].status == "ok"


@pytest.mark.parametrize("path,body", [("completions", COUNTING), ("chat/completions", CHAT_COUNTING)])
def test_a_stream_cut_off_by_the_shutdown_ends_with_an_error_not_stop(bundled_engine, path, body):
    """Issue 30 #4: a stream the shutdown's deadline cut short ended with finish_reason 'stop' and [DONE],
    as if complete. It now ends with 'abort' and an in-band error (recorded `cancelled`)."""
    with Server(bundled_engine, slots=1) as server:
        events = []
        with httpx.stream("POST", f"{server.url}/v1/{path}", json={**body, "stream": True}, timeout=60) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                if len(events) == 3:  # decoding: the shutdown's deadline now (uvicorn's, in serve)
                    threading.Thread(target=server.scheduler.stop).start()
        chunks = [orjson.loads(e) for e in events[:-1]]
        assert events[-1] == "[DONE]" and chunks[-1]["error"]["code"] == "engine_shutdown"
        finishes = [c["choices"][0]["finish_reason"] for c in chunks if c.get("choices")]
        assert finishes[-1] == "abort" and "stop" not in finishes
        assert server.records[-1].status == "cancelled"


def test_sigterm_cancels_stuck_requests_within_the_shutdown_timeout(tmp_path):
    port, engine_port = free_port(), free_port()
    database = tmp_path / "specwatch.db"
    collector = start_collector(port, tmp_path / "collector.log", f"sqlite:///{database}")
    engine_url, log = f"http://127.0.0.1:{engine_port}", tmp_path / "engine.log"
    engine = subprocess.Popen(
        specwatch_command("engine", "serve", "--port", str(engine_port), "--slots", "2", "--shutdown-timeout", "3")
        + ["--collector", f"http://127.0.0.1:{port}", "--instance", "sigterm", "--spool-dir", str(tmp_path / "spool")]
        + ["--dtype", "float32"],
        env=child_env(),
        stdout=log.open("wb"),
        stderr=subprocess.STDOUT,
    )
    try:
        wait_for(lambda: _answers(f"{engine_url}/v1/models") or engine.poll() is not None, "the engine to start", 300)
        assert engine.poll() is None, log.read_text()
        answers = []
        clients = [threading.Thread(target=_stuck_client, args=(engine_url, answers)) for _ in range(2)]
        for client in clients:
            client.start()
        wait_for(lambda: _running(engine_url) == 2, "both requests to be decoding")
        engine.send_signal(signal.SIGTERM)
        signalled = time.monotonic()
        code = engine.wait(timeout=30)
        took = time.monotonic() - signalled
        for client in clients:
            client.join(timeout=10)
        assert code == 0 and 3 <= took < 3 + 5, f"exit {code} after {took:.1f} s: {log.read_text()}"
        assert answers == [503, 503]
        statuses = wait_for(lambda: _statuses(database, "sigterm", 2), "both records in the collector", 30)
        assert statuses == ["cancelled", "cancelled"] and "Traceback" not in log.read_text()
    finally:
        engine.kill()
        collector.terminate()
        collector.wait(timeout=30)


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=1).status_code == 200
    except httpx.HTTPError:
        return False


def _stuck_client(engine_url: str, answers: list) -> None:
    """A client waiting on a long request: the shutdown's deadline answers it 503."""
    try:
        answers.append(httpx.post(f"{engine_url}/v1/completions", json=COUNTING, timeout=120).status_code)
    except httpx.HTTPError as exc:
        answers.append(repr(exc))


def _running(engine_url: str) -> float:
    metrics = httpx.get(f"{engine_url}/metrics", timeout=5).text
    line = next(line for line in metrics.splitlines() if line.startswith("specwatch_engine_num_requests_running "))
    return float(line.split()[1])


def _statuses(database, instance: str, expected: int) -> list[str] | None:
    with sqlite3.connect(database) as db:
        rows = db.execute("SELECT status FROM requests WHERE instance = ?", (instance,)).fetchall()
    return sorted(row[0] for row in rows) if len(rows) >= expected else None


def test_a_request_abandoned_while_queued_is_recorded_cancelled(bundled_engine):
    """Issue 57: GuideLLM cut 8 streams at its end while 4 waited for a slot; those 4 left no record, so the
    store held fewer requests than the client sent. Now each is recorded, cancelled with no output."""
    with Server(bundled_engine, slots=1) as server:

        def first() -> None:
            with contextlib.suppress(httpx.TimeoutException):  # it runs for minutes: its client leaves at 3 s
                httpx.post(f"{server.url}/v1/completions", json=COUNTING, timeout=3)

        running = threading.Thread(target=first)
        running.start()
        wait_for(lambda: server.scheduler.active == 1, "the first request to run")
        headers = {"x-request-id": "waited-then-left"}
        with pytest.raises(httpx.TimeoutException):  # queued behind the first; its client leaves after 1 s
            httpx.post(f"{server.url}/v1/completions", json=COUNTING, headers=headers, timeout=1.0)
        running.join()
        records = wait_for(lambda: len(server.records) >= 2 and server.records, "both records")
        queued = next(r for r in records if r.request_id == "waited-then-left")
        assert (queued.status, queued.output_tokens, queued.ttft_s) == ("cancelled", 0, None)
        assert queued.queue_s >= 0.9 and queued.prompt_tokens > 0
