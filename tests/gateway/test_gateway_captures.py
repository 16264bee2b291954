"""Captures end to end (issue 56): the bundled engine and the gateway in front of it, each with a capture
policy, send redacted, capped captures to a real collector (in this process); the admin reads them back,
one per request (the engine's and the gateway's share the request id), text as the client got it."""

from __future__ import annotations

import httpx
import orjson
from engine_harness import BackgroundServer
from gateway_harness import GatewayServer
from thread_server import ThreadServer
from waiting import wait_for

from specwatch.collector.settings import Settings
from specwatch.engine.scheduler import SchedulerConfig
from specwatch.service.app import create_app
from specwatch.telemetry.capture import REDACTED, CapturePolicy, Capturer, Redactor
from specwatch.telemetry.capture_client import CaptureClient
from specwatch.telemetry.sink import TelemetrySink

SECRET = "sk-" + "Zq9" * 8


def captures(url: str) -> list[dict]:
    answer = httpx.get(f"{url}/v1/captures", headers={"authorization": "Bearer adm"})
    assert answer.status_code == 200, answer.text
    return answer.json()["captures"]


def ask(url: str, content: str, stream: bool) -> str:
    body = {"messages": [{"role": "user", "content": content}], "max_tokens": 12, "temperature": 0, "stream": stream}
    body["tags"] = {"tenant": "acme"}
    answer = httpx.post(f"{url}/v1/chat/completions", json=body, timeout=120)
    assert answer.status_code == 200, answer.text
    if not stream:
        return answer.json()["choices"][0]["message"]["content"]
    events = [orjson.loads(line[6:]) for line in answer.text.splitlines() if line.startswith("data: {")]
    return "".join(c["delta"].get("content") or "" for e in events for c in e.get("choices", []))


def test_engine_and_gateway_captures_reach_the_admin_redacted_and_once(bundled_engine, tmp_path):
    tokens = {"ingest_token": "ing", "admin_token": "adm", "read_token": "rd", "ingest_processes": 0}
    settings = Settings(data_dir=tmp_path, database_url=f"sqlite:///{tmp_path}/c.db", **tokens)
    redact = Redactor.of([r"sk-[A-Za-z0-9]{20,}"])
    with ThreadServer(create_app(settings)) as collector:
        engine_client, gateway_client = (CaptureClient(collector.url, "ing", flush_interval_s=0.2) for _ in "eg")
        engine_sink = TelemetrySink("engine-0", capturer=Capturer(CapturePolicy(rate=1.0), redact))
        engine_sink.capture_client = engine_client
        engine = BackgroundServer(bundled_engine, SchedulerConfig(slots=2, max_queue=8), sink=engine_sink)
        with engine, GatewayServer([f"eng={engine.url}"]) as gateway:
            gateway.gateway.sink.capturer = Capturer(CapturePolicy(rate=1.0, max_chars=200), redact)
            gateway.gateway.sink.capture_client = gateway_client
            whole = ask(gateway.url, f"Repeat: my key is {SECRET}.", stream=False)
            streamed = ask(gateway.url, "Count: 1, 2, 3, 4,", stream=True)
            direct = ask(engine.url, "x" * 400, stream=False)  # the engine alone: its own capture only
        engine_client.close()
        gateway_client.close()
        wait_for(lambda: len(captures(collector.url)) == 3, "three captures", timeout=10)
        found = captures(collector.url)
        forbidden = httpx.get(f"{collector.url}/v1/captures", headers={"authorization": "Bearer rd"})
    by_prompt = {c["prompt"][-1]["content"][:12]: c for c in found}
    assert forbidden.status_code == 403
    assert SECRET not in orjson.dumps(found).decode()
    assert by_prompt["Repeat: my k"]["prompt"][-1]["content"] == f"Repeat: my key is {REDACTED}."
    assert by_prompt["Repeat: my k"]["output"] == whole and by_prompt["Count: 1, 2,"]["output"] == streamed
    assert (
        by_prompt["xxxxxxxxxxxx"]["output"] == direct and len(by_prompt["xxxxxxxxxxxx"]["prompt"][0]["content"]) == 400
    )
    assert {c["tenant"] for c in found} == {"acme"} and all(c["drafter"] for c in found if c["num_draft_tokens"])
