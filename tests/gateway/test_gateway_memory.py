"""Issue 30 #9: a large non-streamed answer goes through the gateway as it arrives, never held whole.

The record still gets the answer's usage and metrics (read from its tail), an answer past
`max_response_bytes` is cut off, and a real gateway process's RSS stays flat across a 63 MiB answer
(it stayed 137 MB up when the answer was buffered whole)."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import orjson
import pytest
from gateway_harness import DECOY, LARGE_USAGE, GatewayServer, ThreadServer, faulty_upstream

from specwatch.common.procs import child_env, free_port, specwatch_command, start_service, stop_process
from specwatch.gateway.whole import top_level_object

MIB = 1 << 20


@pytest.fixture(scope="module")
def upstream():
    with ThreadServer(faulty_upstream()) as server:
        yield server


def test_a_large_answer_passes_whole_and_its_record_reads_usage_and_metrics_from_the_tail(upstream):
    with GatewayServer([f"p={upstream.url},drafter=ngram"]) as gw:  # holds 1 MiB, relays the rest
        answer = httpx.post(f"{gw.url}/v1/completions", json={"prompt": "large", "size": 3 * MIB}, timeout=30)
        assert answer.status_code == 200 and answer.headers["x-specwatch-upstream"] == "p"
        body = answer.json()
        assert body["choices"][0]["text"] == DECOY + "x" * 3 * MIB and body["usage"] == LARGE_USAGE
        record = gw.wait_records(1)[0]
    assert (record.status, record.prompt_tokens, record.output_tokens) == ("ok", 5, 4096)
    assert (record.num_draft_tokens, record.accepted_per_position, record.ttft_s) == (12, [5, 3], 0.012)


def test_an_answer_past_the_cap_is_cut_off_and_recorded_too_large(upstream):
    with GatewayServer([f"p={upstream.url}"], max_response_bytes=2 * MIB) as gw:
        with pytest.raises(httpx.RemoteProtocolError):  # the body ends before its last chunk
            httpx.post(f"{gw.url}/v1/completions", json={"prompt": "large", "size": 3 * MIB}, timeout=30)
        record = gw.wait_records(1)[0]
    assert (record.status, record.error) == ("error", "upstream:too_large")


@pytest.mark.parametrize(
    "tail,usage",
    [
        ('x","n":1}],"usage":{"prompt_tokens":1},"metrics":{"a":{"b":2}}}', {"prompt_tokens": 1}),
        ('say \\"usage\\": {\\"prompt_tokens\\": 9}"}], "usage" : {"t": 2} }', {"t": 2}),  # decoy in a string
        ('say \\"usage\\": {\\"prompt_tokens\\": 9}"}]}', None),
        ('"usage":{"t":1', None),  # cut short
        ('"usage":[1]}', None),
    ],
)
def test_usage_is_found_only_as_a_key(tail, usage):
    assert top_level_object(tail, "usage") == usage


def rss_bytes(pid: int) -> int:
    try:
        import psutil
    except ImportError:
        import os

        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    return psutil.Process(pid).memory_info().rss


def test_a_real_gateway_process_keeps_its_memory_across_a_63_mib_answer(upstream, tmp_path):
    port = free_port()
    cmd = specwatch_command("gateway", "serve", "--port", str(port), "--upstream", f"p={upstream.url}")
    ready = f"http://127.0.0.1:{port}/health"
    gateway = start_service("gateway", cmd, child_env(), tmp_path / "gateway.log", ready, 60)
    url = f"http://127.0.0.1:{port}/v1/completions"
    try:
        assert httpx.post(url, json={"prompt": "large", "size": 2 * MIB}, timeout=30).status_code == 200  # warm
        before, peak, done = rss_bytes(gateway.pid), [], threading.Event()
        sampler = threading.Thread(target=_sample_peak, args=(gateway.pid, peak, done), daemon=True)
        sampler.start()
        received, last = 0, b""
        with httpx.stream("POST", url, json={"prompt": "large", "size": 63 * MIB}, timeout=60) as answer:
            for chunk in answer.iter_bytes():
                received, last = received + len(chunk), (last + chunk)[-4096:]
        done.set()
        sampler.join(5)
        after = rss_bytes(gateway.pid)
    finally:
        stop_process(gateway)
    assert answer.status_code == 200 and received > 63 * MIB
    assert orjson.loads(b'{"usage":' + last.split(b',"usage":')[1])["usage"] == LARGE_USAGE
    growth, peak_growth = (after - before) / MIB, (max(peak, default=before) - before) / MIB
    print(f"gateway RSS: {before / MIB:.0f} MiB before, peak +{peak_growth:.1f} MiB, +{growth:.1f} MiB after")
    assert growth < 16 and peak_growth < 24, (growth, peak_growth)


def _sample_peak(pid: int, peak: list[int], done: threading.Event) -> None:
    """RSS every 5 ms into `peak` until `done`."""
    while not done.wait(0.005):
        peak.append(rss_bytes(pid))
