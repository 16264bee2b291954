"""The gateway's live canary share: `POST /v1/control/canary` (strict, admin token), `GET /v1/control/state`,
the router following it, and the `mode_switch` event each change leaves."""

from __future__ import annotations

import httpx
import pytest
from gateway_harness import GatewayServer

from specwatch.common.procs import free_port
from specwatch.gateway.routing import Router, RoutingConfig
from specwatch.telemetry.schema import EngineEvent

TOKEN = {"authorization": "Bearer gw-token"}


def pools() -> list[str]:
    """Two upstreams nobody listens on: the control API needs none of them up."""
    return [f"cand=http://127.0.0.1:{free_port()},drafter=ngram", f"today=http://127.0.0.1:{free_port()}"]


def arms(router: Router, n: int = 400) -> list[str | None]:
    return [router.decide(10, None, True, 0.0, now=float(i)).arm for i in range(n)]


def test_the_router_follows_the_live_share():
    router = Router(RoutingConfig(), seed=1)
    assert set(arms(router)) == {None} and router.state["canary"] is None
    assert router.set_canary(1.0) is None
    assert set(arms(router)) == {"spec"}  # promoted: every request to the candidate
    assert router.set_canary(0.0) == 1.0
    assert set(arms(router)) == {"control"}  # rolled back
    router.set_canary(0.25)
    assert 0.15 < arms(router).count("spec") / 400 < 0.35
    with pytest.raises(ValueError):
        router.set_canary(1.5)


@pytest.fixture(scope="module")
def gateway():
    with GatewayServer(pools(), control_token="gw-token", name="edge") as gw:
        events: list[EngineEvent] = []
        gw.gateway.sink.subscribe(EngineEvent, events.append)
        gw.events = events
        yield gw


def post(gw, body, headers=TOKEN, raw: bytes | None = None) -> httpx.Response:
    url = f"{gw.url}/v1/control/canary"
    if raw is not None:
        return httpx.post(url, content=raw, headers={**headers, "content-type": "application/json"})
    return httpx.post(url, json=body, headers=headers)


def test_setting_the_share_shows_in_the_state_and_leaves_an_event(gateway):
    answer = post(gateway, {"share": 0.05, "reason": "specwatch tune canary"})
    assert answer.status_code == 200 and answer.json()["canary"] == 0.05 and answer.json()["name"] == "edge"
    assert post(gateway, {"share": 1}).json()["canary"] == 1.0
    state = httpx.get(f"{gateway.url}/v1/control/state", headers=TOKEN).json()
    assert state["canary"] == 1.0 and {u["pool"] for u in state["upstreams"]} == {"spec", "plain"}
    switches = [e.detail for e in gateway.events if e.kind == "mode_switch"][-2:]
    assert switches == [
        {"role": "gateway", "canary": {"from": None, "to": 0.05}, "reason": "specwatch tune canary"},
        {"role": "gateway", "canary": {"from": 0.05, "to": 1.0}, "reason": "manual"},
    ]
    assert post(gateway, {"share": None}).json()["canary"] is None  # the split ended


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "share: required"),
        ({"share": 1.01}, "share: must be a number from 0 to 1"),
        ({"share": -0.1}, "share: must be a number from 0 to 1"),
        ({"share": True}, "share: must be a number from 0 to 1"),
        ({"share": "0.5"}, "share: must be a number from 0 to 1"),
        ({"share": 0.5, "weight": 1}, "unknown field(s): weight"),
        ({"share": 0.5, "reason": ""}, "reason: a string of 1 to 200 characters"),
        ({"share": 0.5, "reason": 7}, "reason: a string of 1 to 200 characters"),
        ([0.5], "request body must be a JSON object"),
    ],
)
def test_bad_bodies_are_400_and_change_nothing(gateway, body, message):
    post(gateway, {"share": 0.3})
    answer = post(gateway, body)
    assert answer.status_code == 400 and message in answer.json()["error"]["message"], answer.text
    assert httpx.get(f"{gateway.url}/v1/control/state", headers=TOKEN).json()["canary"] == 0.3


def test_non_finite_and_broken_json_are_400(gateway):
    for raw in (b'{"share": NaN}', b'{"share": Infinity}', b'{"share": 1e999}', b'{"share": '):
        assert post(gateway, None, raw=raw).status_code == 400, raw


def test_the_token_is_required(gateway):
    assert post(gateway, {"share": 0.5}, headers={}).status_code == 401
    assert post(gateway, {"share": 0.5}, headers={"authorization": "Bearer wrong"}).status_code in (401, 403)
    with GatewayServer(pools()) as off:  # no token configured: the control API is off
        assert post(off, {"share": 0.5}).status_code == 403
