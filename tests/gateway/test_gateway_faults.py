"""The gateway against upstreams that fail: errors passed through, malformed bodies, streams cut
off, dead upstreams (failover), clients that leave, oversized and malformed requests. The upstreams
are real HTTP servers on loopback (a misbehaving OpenAI server, a port nobody listens on)."""

from __future__ import annotations

import socket
import subprocess

import httpx
import orjson
import pytest
from gateway_harness import DroppingUpstream, GatewayServer, ThreadServer, faulty_upstream
from waiting import wait_for

from specwatch.common.procs import free_port, specwatch_command
from specwatch.gateway.routing import RoutingConfig


@pytest.fixture(scope="module")
def upstream():
    with ThreadServer(faulty_upstream()) as server:
        yield server


def post(url: str, body: dict, **kwargs) -> httpx.Response:
    return httpx.post(f"{url}/v1/completions", json=body, timeout=30, **kwargs)


def test_upstream_errors_pass_through_unchanged_and_are_recorded(upstream):
    with GatewayServer([f"p={upstream.url}"]) as gw:
        direct = post(upstream.url, {"prompt": "fail500"})
        through = post(gw.url, {"prompt": "fail500"})
        assert (through.status_code, through.content) == (500, direct.content)
        record = gw.wait_records(1)[0]
        assert (record.status, record.error, record.instance) == ("error", "upstream:500", "p")


def test_a_cookie_an_upstream_sets_never_rides_on_another_request(upstream):
    """The gateway keeps no cookie jar: one client's upstream session must not leak into the next request."""
    with GatewayServer([f"p={upstream.url}"]) as gw:
        assert post(gw.url, {"prompt": "cookie"}).status_code == 200
        assert post(gw.url, {"prompt": "next client"}).status_code == 200
        seen = upstream.server.config.app.state.seen[-1]
        assert seen["body"]["prompt"] == "next client" and "cookie" not in seen["headers"]


def test_a_malformed_upstream_body_is_a_502_naming_the_upstream(upstream):
    with GatewayServer([f"odd-one={upstream.url}"]) as gw:
        response = post(gw.url, {"prompt": "malformed"})
        assert response.status_code == 502
        assert "upstream odd-one returned a malformed body" in response.json()["error"]["message"]
        assert gw.wait_records(1)[0].error == "upstream:malformed"


def test_a_stream_cut_off_mid_way_ends_with_an_in_band_error(upstream):
    with GatewayServer([f"p={upstream.url}"]) as gw:
        with httpx.stream("POST", f"{gw.url}/v1/completions", json={"prompt": "break", "stream": True}) as response:
            text = b"".join(response.iter_raw()).decode()
        assert response.status_code == 200
        assert '"content":"hi"' in text and "broke off the stream" in text and text.endswith("data: [DONE]\n\n")
        record = gw.wait_records(1)[0]
        assert (record.status, record.error) == ("error", "upstream:disconnected")


def test_a_dead_upstream_fails_over_within_the_pool_and_then_across_pools(upstream):
    dead = f"http://127.0.0.1:{free_port()}"
    upstreams = [f"dead=http://127.0.0.1:{free_port()},drafter=ngram", f"p1={dead}", f"p2={upstream.url}"]
    with GatewayServer(upstreams, RoutingConfig()) as gw:
        # the first health check found the spec pool dead: requests go to the plain pool, 'failover'
        response = post(gw.url, {"prompt": "hello"})
        assert response.status_code == 200 and response.headers["x-specwatch-upstream"] == "p2"
        record = gw.wait_records(1)[0]
        assert (record.instance, record.mode_reason, record.status) == ("p2", "failover", "ok")
        states = gw.gateway.states
        assert not states["dead"].healthy and not states["p1"].healthy and states["p2"].healthy
        assert "ConnectError" in states["p1"].last_error


def test_an_upstream_dying_between_health_checks_costs_a_retry_not_an_error(upstream):
    with ThreadServer(faulty_upstream()) as doomed:
        gw = GatewayServer([f"a={doomed.url}", f"b={upstream.url}"], health_interval_s=60.0)
        with gw:
            gw.gateway.states["b"].in_flight = 5  # so 'a' is the least loaded: the one picked first
            doomed.server.should_exit = True
            doomed.thread.join(10)
            response = post(gw.url, {"prompt": "hello"})
            gw.gateway.states["b"].in_flight -= 5
            assert response.status_code == 200 and response.headers["x-specwatch-upstream"] == "b"
            record = gw.wait_records(1)[0]
            assert (record.instance, record.retries, record.status) == ("b", 1, "ok")
            assert not gw.gateway.states["a"].healthy


def test_no_upstream_left_is_a_503_saying_why():
    with GatewayServer([f"only=http://127.0.0.1:{free_port()}"], name="edge-1") as gw:
        response = post(gw.url, {"prompt": "hello"})
        assert response.status_code == 503
        assert "no upstream can take the request" in response.json()["error"]["message"]
        record = gw.wait_records(1)[0]
        assert (record.instance, record.status, record.error) == ("edge-1", "error", "gateway:no_upstream")
        assert httpx.get(f"{gw.url}/health").status_code == 503


def test_a_client_leaving_mid_stream_closes_the_upstream_request(upstream):
    with GatewayServer([f"p={upstream.url}"]) as gw:
        before = len(upstream.server.config.app.state.slow_sent)
        with httpx.stream("POST", f"{gw.url}/v1/completions", json={"prompt": "slow", "stream": True}) as response:
            for n, _ in enumerate(response.iter_raw(), 1):
                if n == 3:
                    break
        sent = upstream.server.config.app.state.slow_sent
        wait_for(lambda: len(sent) > before, "the upstream stream to end", timeout=10)
        assert sent[-1] < 100  # stopped long before its 200 chunks
        record = gw.wait_records(1)[0]
        assert (record.status, record.error) == ("cancelled", "client:disconnected")
        assert gw.gateway.states["p"].in_flight == 0
        # issue 57 #5: a cut stream keeps the tokens it delivered (a chunk per step: at least one token each)
        assert 3 <= record.output_tokens <= sent[-1]


def test_a_client_leaving_right_after_done_is_served_not_cancelled(upstream):
    """Issue 57 #4: the client closed after [DONE] before the upstream's connection ended: it got everything."""
    with GatewayServer([f"p={upstream.url}"]) as gw:
        body = {"prompt": "lingering", "stream": True, "stream_options": {"include_usage": True}}
        with httpx.stream("POST", f"{gw.url}/v1/completions", json=body, timeout=30) as response:
            lines = []
            for line in response.iter_lines():
                lines.append(line)
                if line == "data: [DONE]":
                    break
        record = gw.wait_records(1)[0]
        assert (record.status, record.error, record.output_tokens) == ("ok", None, 3)
        assert sum(line.startswith("data: {") for line in lines) == 4


def test_bad_requests_are_4xx_with_a_message_and_never_reach_an_upstream(upstream):
    seen = upstream.server.config.app.state.seen
    with GatewayServer([f"p={upstream.url}"], max_body_bytes=2048) as gw:
        before = len(seen)
        cases = [
            (b"x" * 4096, 413, "over the gateway's limit of 2048 bytes"),
            (b"{not json", 400, "not valid JSON"),
            (b"[1, 2]", 400, "must be a JSON object"),
            (b'{"prompt": "a", "stream": "yes"}', 400, "stream: must be true or false"),
            (b'{"prompt": "a", "tags": {"": "x"}}', 400, "tags"),
            (b'{"prompt": "a", "tags": {"k": "\\u0000"}}', 400, "tags.k"),
            (b'{"prompt": "a", "tags": ["x"]}', 400, "tags: must be an object"),
        ]
        for body, status, message in cases:
            response = httpx.post(f"{gw.url}/v1/completions", content=body, timeout=10)
            assert response.status_code == status, body
            assert message in response.json()["error"]["message"], body
        bad_header = httpx.post(
            f"{gw.url}/v1/completions", json={"prompt": "a"}, headers={"x-specwatch-tags": "novalue"}, timeout=10
        )
        assert bad_header.status_code == 400
        assert len(seen) == before and gw.records == []


def test_headers_and_tags_travel(upstream):
    seen = upstream.server.config.app.state.seen
    headers = {
        "authorization": "Bearer client-key",
        "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        "x-specwatch-tags": "scenario=chat,tenant=acme",
        "x-specwatch-session": "user-7",
    }
    with GatewayServer([f"p={upstream.url}"]) as gw:
        response = post(
            gw.url, {"prompt": "hello", "tags": {"scenario": "grounded", "team": "search"}}, headers=headers
        )
        assert response.status_code == 200
        forwarded = seen[-1]["headers"]
        assert "authorization" not in forwarded  # the client's key is not for the upstream (issue 30 #2)
        assert forwarded["traceparent"] == headers["traceparent"]
        assert forwarded["x-request-id"] == response.headers["x-specwatch-request-id"]
        record = gw.wait_records(1)[0]
        # the header wins; the gateway names itself (its --name, here the default)
        assert record.tags == {"scenario": "chat", "team": "search", "tenant": "acme", "gateway": "gateway"}
        assert record.request_id == response.headers["x-specwatch-request-id"]
        assert float(forwarded["x-specwatch-started-at"]) == record.started_at  # exactly: the engine adopts it
        again = post(gw.url, {"prompt": "hello"}, headers={"x-request-id": "client-key-7"})
        assert again.headers["x-specwatch-request-id"] == seen[-1]["headers"]["x-request-id"] == "client-key-7"
        assert gw.wait_records(2)[-1].request_id == "client-key-7"


def test_the_client_authorization_goes_only_to_an_upstream_configured_to_receive_it(upstream):
    seen = upstream.server.config.app.state.seen
    key = {"authorization": "Bearer client-key"}
    with GatewayServer([f"p={upstream.url},auth=forward"]) as gw:
        assert post(gw.url, {"prompt": "hello"}, headers=key).status_code == 200
        assert seen[-1]["headers"]["authorization"] == "Bearer client-key"
    with GatewayServer([f"p={upstream.url},auth=none"]) as gw:
        assert post(gw.url, {"prompt": "hello"}, headers=key).status_code == 200
        assert "authorization" not in seen[-1]["headers"]


def test_with_an_api_key_the_openai_routes_need_it_and_refusals_reach_no_upstream(upstream):
    seen = upstream.server.config.app.state.seen
    with GatewayServer([f"p={upstream.url},auth=forward"], api_key="gw-key") as gw:
        before = len(seen)
        for headers in ({}, {"authorization": "Bearer wrong"}):
            refused = post(gw.url, {"prompt": "hello"}, headers=headers)
            assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
            assert httpx.get(f"{gw.url}/v1/models", headers=headers).status_code == 401
        assert len(seen) == before and gw.records == []  # nothing proxied, nothing recorded
        assert httpx.get(f"{gw.url}/health").status_code == 200
        assert post(gw.url, {"prompt": "hello"}, headers={"authorization": "Bearer gw-key"}).status_code == 200
        assert seen[-1]["headers"]["authorization"] == "Bearer gw-key"  # auth=forward: the upstream may check it too


def test_unknown_routes_and_methods_are_json_errors(upstream):
    with GatewayServer([f"p={upstream.url}"]) as gw:
        missing = httpx.post(f"{gw.url}/v1/embeddings", json={})
        assert missing.status_code == 404 and "/v1/embeddings" in missing.json()["error"]["message"]
        wrong = httpx.get(f"{gw.url}/v1/completions")
        assert wrong.status_code == 405 and wrong.json()["error"]["type"] == "invalid_request_error"


def test_a_connection_dropped_before_any_answer_is_retried_once_not_taken_for_a_dead_upstream():
    upstream = DroppingUpstream()
    try:
        with GatewayServer([f"p={upstream.url}"]) as gw:
            response = post(gw.url, {"prompt": "hello"})
            assert response.status_code == 200 and upstream.posts == 2
            record = gw.wait_records(1)[0]
            assert (record.status, record.retries) == ("ok", 1)
            assert gw.gateway.states["p"].healthy
    finally:
        upstream.close()


def test_an_upstream_slow_to_answer_health_checks_is_down_only_after_three_in_a_row():
    app = faulty_upstream()
    with ThreadServer(app) as slow, GatewayServer([f"p={slow.url}"], health_interval_s=0.1) as gw:
        state = gw.gateway.states["p"]
        app.state.health_delay_s = 1.5  # over the 1 s check timeout
        wait_for(lambda: state.failed_checks >= 1, "a health check to time out", timeout=10)
        assert state.healthy  # one slow answer is not a dead upstream
        wait_for(lambda: not state.healthy, "three timeouts in a row", timeout=20)
        assert "3 failures in a row (last: ReadTimeout)" in state.last_error
        app.state.health_delay_s = 0.0
        wait_for(lambda: state.healthy, "the upstream to be healthy again", timeout=20)


def test_one_request_timing_out_does_not_take_its_upstream_out_for_everyone(upstream):
    """Issue 30 #6: one upstream timeout marked the upstream down until the next health check, and
    other clients got an immediate 503 meanwhile."""
    with GatewayServer([f"p={upstream.url}"], upstream_timeout_s=0.5, health_interval_s=60.0) as gw:
        timed_out = post(gw.url, {"prompt": "stall"})
        assert timed_out.status_code == 504 and gw.gateway.states["p"].healthy
        assert post(gw.url, {"prompt": "hello"}).status_code == 200  # the next client is served
        assert [r.error for r in gw.wait_records(2)] == ["upstream:timeout", None]


def test_a_body_that_trickles_in_is_a_408_and_a_huge_answer_a_502(upstream):
    with GatewayServer([f"p={upstream.url}"], body_timeout_s=0.5, max_response_bytes=1024 * 1024) as gw:
        with socket.create_connection(("127.0.0.1", gw.port), timeout=10) as conn:
            conn.sendall(b'POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-length: 100\r\n\r\n{"prompt"')
            reply = b""
            while b"did not arrive" not in reply and (part := conn.recv(65536)):  # headers and body may part
                reply += part
        assert reply.startswith(b"HTTP/1.1 408") and b"did not arrive within 0.5 s" in reply
        huge = post(gw.url, {"prompt": "huge"})
        assert huge.status_code == 502 and "sent a body over 1048576 bytes" in huge.json()["error"]["message"]
        assert gw.wait_records(1)[0].error == "upstream:too_large"


def test_an_upstream_stream_without_event_framing_is_passed_on_not_hoarded():
    from specwatch.gateway.records import MAX_EVENT_BYTES, SseReader

    reader = SseReader(drop_usage_chunk=False)
    blob = b"x" * (MAX_EVENT_BYTES // 4)
    out = b"".join(reader.feed(blob) for _ in range(5))
    assert len(out) >= MAX_EVENT_BYTES and reader.malformed and len(reader.buffer) < MAX_EVENT_BYTES


@pytest.mark.parametrize(
    "args, message",
    [
        (["--upstream", "bad"], "expected NAME=URL"),
        (["--upstream", "a=http://x", "--upstream", "a=http://y"], "names must be unique"),
        (["--upstream", "a=http://x", "--canary", "1.5"], "canary must be in [0, 1]"),
        (["--upstream", "a=http://x,auth=yes"], "auth must be none or forward"),
        (["--upstream", "a=http://x", "--max-body-bytes", "10"], "--max-body-bytes must be at least 1024"),
        (["--upstream", "a=http://x", "--tokenizer", "/nonexistent/tok.json"], "cannot load a tokenizer"),
    ],
)
def test_gateway_serve_refuses_bad_options_with_exit_2(args, message):
    done = subprocess.run(specwatch_command("gateway", "serve", *args), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_a_stream_the_engine_cut_off_at_shutdown_is_recorded_as_an_error():
    """Issue 30 #4: the engine's stream cut short by its shutdown ends with 'abort' and an in-band error."""
    from specwatch.gateway.records import Outcome, SseReader

    reader = SseReader(drop_usage_chunk=False)
    final = {"choices": [{"index": 0, "text": "", "finish_reason": "abort"}], "usage": {"completion_tokens": 3}}
    error = {"error": {"message": "the engine shut down before the request finished", "code": "engine_shutdown"}}
    stream = b"".join(b"data: " + orjson.dumps(event) + b"\n\n" for event in (final, error)) + b"data: [DONE]\n\n"
    assert reader.feed(stream) == stream  # passed on unchanged
    outcome = Outcome("r", 1.78e9, "m", 1, {}, "default", None, None)
    reader.note(outcome)
    assert (outcome.status, outcome.error) == ("error", "upstream:stream_error")
    assert "shut down" in reader.error and outcome.usage == {"completion_tokens": 3}
