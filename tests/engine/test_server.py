"""The OpenAI-compatible server on the bundled model, driven by the official `openai` client."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import openai
import pytest
from engine_harness import BackgroundServer
from waiting import wait_for

from specwatch.engine.policy import PolicyConfig
from specwatch.engine.scheduler import SchedulerConfig
from specwatch.telemetry.schema import EngineEvent


def Server(
    engine, slots: int = 2, max_queue: int = 8, policy: PolicyConfig = PolicyConfig(), **app_options
) -> BackgroundServer:
    return BackgroundServer(engine, SchedulerConfig(slots=slots, max_queue=max_queue), policy, **app_options)


TOKEN = {"authorization": "Bearer s3cret"}
COUNTING = "Count from 1 to 500: 1, 2, 3, 4, 5,"  # greedy continues it for hundreds of tokens


@pytest.fixture(scope="module")
def server(bundled_engine):
    with Server(bundled_engine, control_token="s3cret") as running:
        yield running


def test_models_and_chat_completion_with_the_openai_client(server, bundled_engine):
    client = server.client()
    assert [m.id for m in client.models.list()] == [bundled_engine.target.name]
    reply = client.chat.completions.create(
        model=bundled_engine.target.name,
        messages=[{"role": "user", "content": "Say hello."}],
        max_tokens=8,
        temperature=0,
        extra_body={"drafter": "ngram", "tags": {"scenario": "chat"}},
    )
    assert reply.choices[0].message.content and reply.usage.completion_tokens <= 8
    assert (
        server.records[-1].tags == {"scenario": "chat"}
        and server.records[-1].output_tokens == reply.usage.completion_tokens
    )


def test_with_an_api_key_the_openai_routes_need_it(bundled_engine):
    with Server(bundled_engine, api_key="k1,k2") as keyed:
        body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        for headers in ({}, {"authorization": "Bearer k3"}):
            refused = httpx.post(f"{keyed.url}/v1/chat/completions", json=body, headers=headers)
            assert refused.status_code == 401 and refused.json()["error"]["type"] == "authentication_error"
        assert keyed.records == []
        assert httpx.get(f"{keyed.url}/healthz").status_code == 200
        client = openai.OpenAI(base_url=f"{keyed.url}/v1", api_key="k2")  # the SDK sends it as a bearer key
        assert [m.id for m in client.models.list()] == [bundled_engine.target.name]


def test_streamed_completion_equals_the_whole_one(server):
    client = server.client()
    prompt = "Repeat: alpha beta gamma alpha beta gamma alpha"
    whole = client.completions.create(model=None, prompt=prompt, max_tokens=16, temperature=0)
    chunks = list(client.completions.create(model=None, prompt=prompt, max_tokens=16, temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == whole.choices[0].text
    assert chunks[-1].choices[0].finish_reason == whole.choices[0].finish_reason
    record = server.records[-1]
    assert record.ttft_s < record.e2e_s and record.mode == "speculative"


def test_bad_requests_get_openai_errors(server):
    client = server.client()
    with pytest.raises(openai.BadRequestError, match="max_tokens"):
        client.completions.create(model=None, prompt="x", max_tokens=0)
    with pytest.raises(openai.BadRequestError, match="unknown drafter"):
        client.completions.create(model=None, prompt="x", max_tokens=2, extra_body={"drafter": "nope"})
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="gpt-9", prompt="x", max_tokens=2)
    bad_json = httpx.post(
        f"{server.url}/v1/completions", content=b"{oops", headers={"content-type": "application/json"}
    )
    assert bad_json.status_code == 400 and "error" in bad_json.json()


def test_short_request_gets_its_first_token_while_a_long_one_runs(server):
    """Iteration-level scheduling: a long generation does not hold back another's first token."""
    client = server.client()
    done = {}

    def long_request():
        done["long"] = client.completions.create(
            model=None, prompt="Write a long story.", max_tokens=200, temperature=0, extra_body={"drafter": "none"}
        )

    thread = threading.Thread(target=long_request)
    thread.start()
    time.sleep(1.0)
    started = time.monotonic()
    stream = client.completions.create(model=None, prompt="Hi", max_tokens=4, temperature=0, stream=True)
    next(iter(stream))
    first_token_s = time.monotonic() - started
    list(stream)
    assert "long" not in done, "the long request finished before the short one started; make it longer"
    thread.join()
    assert first_token_s < 5.0


def test_queue_overflow_is_429_with_retry_after(bundled_engine):
    with Server(bundled_engine, slots=1, max_queue=1) as small:

        async def flood():
            async with httpx.AsyncClient(base_url=small.url, timeout=120) as http:
                body = {"prompt": "Count to one hundred.", "max_tokens": 100, "temperature": 0, "drafter": "none"}
                return await asyncio.gather(*(http.post("/v1/completions", json=body) for _ in range(4)))

        responses = asyncio.run(flood())
    codes = sorted(r.status_code for r in responses)
    assert codes == [200, 200, 429, 429]  # one decoding, one queued, two turned away
    rejected = next(r for r in responses if r.status_code == 429)
    assert int(rejected.headers["retry-after"]) >= 1 and rejected.json()["error"]["type"] == "rate_limit_error"


def test_client_disconnect_cancels_the_request(bundled_engine):
    """The client reads the first chunk and leaves: the request is recorded `cancelled`.
    Greedy counting cannot end by itself within 400 tokens (sampled "Tell a long story." sometimes
    drew the end-of-sequence token second, so the request finished `ok` before the client left)."""
    body = {"prompt": COUNTING, "max_tokens": 400, "temperature": 0, "stream": True}
    with Server(bundled_engine, slots=1) as small:
        with httpx.stream("POST", f"{small.url}/v1/completions", json=body, timeout=60) as response:
            first = next(line for line in response.iter_lines() if line.startswith("data: "))
        assert '"finish_reason":null' in first  # left mid-generation
        wait_for(lambda: small.records, "the cancelled request's record", timeout=30)
    assert small.records[0].status == "cancelled" and small.records[0].output_tokens < 400


def test_control_api_overrides_the_mode(server):
    body = {"mode": "autoregressive", "reason": "alert"}
    override = httpx.post(f"{server.url}/v1/control/mode", json=body, headers=TOKEN).json()
    assert override["override"] == "autoregressive"
    server.client().completions.create(model=None, prompt="Hi there", max_tokens=3, temperature=0)
    assert (server.records[-1].mode, server.records[-1].mode_reason) == ("autoregressive", "alert")
    httpx.post(f"{server.url}/v1/control/mode", json={"mode": "auto"}, headers=TOKEN)
    assert httpx.post(f"{server.url}/v1/control/mode", json={"mode": "sideways"}, headers=TOKEN).status_code == 400


class ExplodingDrafter:
    """Fails like a draft model running out of memory, after a few good rounds."""

    name = "ngram"

    def __init__(self) -> None:
        self.calls = 0

    def begin(self, max_len: int) -> None:
        pass

    def propose(self, tokens, k, params, generator):
        self.calls += 1
        if self.calls > 2:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return [], None

    def rollback(self, committed: int) -> None:
        pass


def test_oom_during_speculation_is_retried_plain_and_recorded(drafting_engine):
    with Server(drafting_engine, slots=2) as small:  # one request in two slots: load 0.5, so the policy speculates
        for slot in small.scheduler.slots:
            slot.drafters["ngram"] = ExplodingDrafter()
        client = small.client()
        prompt = "List five colours of the rainbow."
        streamed = "".join(
            c.choices[0].text
            for c in client.completions.create(model=None, prompt=prompt, max_tokens=24, temperature=0, stream=True)
        )
        plain = client.completions.create(
            model=None, prompt=prompt, max_tokens=24, temperature=0, extra_body={"drafter": "none"}
        )
    failed = small.records[0]
    assert (failed.status, failed.retries, failed.error, failed.mode) == ("ok", 1, "draft:oom", "speculative")
    assert streamed == plain.choices[0].text  # no text lost or repeated across the retry


def test_control_api_requires_the_token_and_acts(bundled_engine):
    events = []
    with Server(bundled_engine, slots=2, control_token="s3cret") as guarded:
        guarded.sink.subscribe(EngineEvent, lambda event: events.append((event.kind, event.detail)))
        assert httpx.post(f"{guarded.url}/v1/control/defragment").status_code == 401
        wrong = httpx.post(f"{guarded.url}/v1/control/defragment", headers={"authorization": "Bearer nope"})
        assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "authentication_error"
        auth = {"authorization": "Bearer s3cret"}
        defrag = httpx.post(f"{guarded.url}/v1/control/defragment", headers=auth).json()
        assert defrag["before"]["fragmentation"] >= 1.0 and defrag["after"]["fragmentation"] >= 1.0
        assert defrag["after"]["reserved"] <= defrag["before"]["reserved"]  # malloc_trim only gives memory back

        guarded.client().completions.create(
            model=None, prompt="Hi", max_tokens=4, temperature=0, extra_body={"drafter": "early-exit:4", "gamma": 2}
        )
        unload = httpx.post(f"{guarded.url}/v1/control/draft", headers=auth, json={"action": "unload"}).json()
        assert unload["unloaded"] == ["early-exit:4"] and "freed_rss_bytes" in unload
        guarded.client().completions.create(
            model=None, prompt="Hi", max_tokens=4, temperature=0, extra_body={"drafter": "early-exit:4", "gamma": 2}
        )
        assert (guarded.records[-1].mode, guarded.records[-1].mode_reason) == ("autoregressive", "memory")
        httpx.post(f"{guarded.url}/v1/control/draft", headers=auth, json={"action": "load", "drafter": "early-exit:4"})
        guarded.client().completions.create(
            model=None, prompt="Hi", max_tokens=4, temperature=0, extra_body={"drafter": "early-exit:4", "gamma": 2}
        )
        assert guarded.records[-1].mode == "speculative"
    assert [kind for kind, _ in events] == ["defrag", "draft_unloaded", "draft_loaded"]


def test_traffic_generator_drives_the_server(server):
    from specwatch.traffic import TrafficConfig, run_traffic, summary

    config = TrafficConfig(
        url=server.url, scenarios=("chat", "extraction"), duration_s=60, max_requests=4, concurrency=2, max_tokens=6
    )
    with open("/dev/null", "w") as devnull:
        rows = {row["scenario"]: row for row in summary(asyncio.run(run_traffic(config, progress=devnull)))}
    assert rows["all"]["requests"] == 4 and rows["all"]["errors"] == 0
    assert rows["all"]["ttft_p50_s"] <= rows["all"]["e2e_p50_s"]
    assert {r.tags["scenario"] for r in server.records[-4:]} <= {"chat", "extraction"}


def test_metrics_count_what_was_served(bundled_engine):
    import shutil
    import subprocess

    from prometheus_client.parser import text_string_to_metric_families

    with Server(bundled_engine, slots=2) as fresh:
        fresh.client().completions.create(model=None, prompt="Repeat: a b c a b c a b", max_tokens=12, temperature=0)
        exposition = httpx.get(f"{fresh.url}/metrics").text
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for f in text_string_to_metric_families(exposition)
        for s in f.samples
    }
    record = fresh.records[-1]
    assert samples[("specwatch_engine_requests_total", (("mode", record.mode), ("status", "ok")))] == 1
    assert samples[("specwatch_engine_output_tokens_total", (("mode", record.mode),))] == record.output_tokens
    if record.num_drafts:
        assert (
            samples[("specwatch_engine_spec_decode_num_draft_tokens_total", (("drafter", "ngram"),))]
            == record.num_draft_tokens
        )
    if shutil.which("promtool"):
        check = subprocess.run(["promtool", "check", "metrics"], input=exposition, capture_output=True, text=True)
        assert check.returncode == 0, check.stdout + check.stderr


def test_a_request_whose_record_fails_does_not_stop_the_scheduler(server):
    """A request the server did not validate (here: a tag the telemetry contract refuses, submitted to the
    scheduler directly) gets its error, and the engine goes on serving: its scheduler thread survives."""
    from specwatch.engine.engine import GenerateRequest

    async def submit() -> object:
        request = GenerateRequest(prompt="Hi", max_tokens=2, drafter=None, tags={"bad\x00": "x"})
        ticket = server.scheduler.submit(request, asyncio.get_running_loop())
        while not isinstance(item := await ticket.events.get(), Exception) and not hasattr(item, "record"):
            pass
        return item

    assert isinstance(asyncio.run(asyncio.wait_for(submit(), 60)), Exception)  # no answer: the thread died
    after = httpx.post(f"{server.url}/v1/completions", json={"prompt": "Hi", "max_tokens": 2}, timeout=60)
    assert after.status_code == 200, after.text
