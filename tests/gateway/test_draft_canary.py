"""`specwatch draft canary` in small (issue 56 #4; the loop on real processes: tests/test_draft_loop.py): it
refuses a gateway whose pools do not both draft, and its verdict states each arm's drafters and acceptance
beside the speed-up, in the CLI's lines, the event's detail and CanaryVerdict's annotations."""

from __future__ import annotations

from gateway_harness import GatewayServer

from specwatch.alerts.canary import annotations_of
from specwatch.alerts.canary_verdict import CanaryRules, decide
from specwatch.cli import main
from specwatch.collector.reads.series import EventRecord
from specwatch.common.procs import free_port
from specwatch.tune_canary import Loads, arms_of, verdict_event, verdict_lines

STATE = {
    "name": "edge",
    "upstreams": [
        {"name": "cand", "pool": "spec", "drafter": "model:retrained", "load": 0.5, "healthy": True},
        {"name": "today", "pool": "plain", "drafter": "model:current", "load": 0.5, "healthy": True},
    ],
}


def group(acceptance: float, s_per_token: float) -> dict:
    figures = {"requests": 9, "errors": 0, "s_per_token_mean": s_per_token, "acceptance_rate": acceptance}
    return figures | {"mean_acceptance_length": 1 + 4 * acceptance, "drafted": 400, "accepted": int(400 * acceptance)}


def test_the_verdict_states_each_arms_drafter_acceptance_and_the_speedup():
    comparison = {"speculative": group(0.875, 0.004), "plain": group(0.0, 0.016), "speedup": 4.0, "p_value": 1e-4}
    loads = Loads()
    loads.add(STATE)
    arms, rules = arms_of(comparison, loads), CanaryRules(min_requests=8)
    verdict = decide(arms["candidate"], arms["control"], 4.0, 1e-4, rules)
    run = {"share": {"from": 0.5, "to": verdict.share_after}, "applied": True}
    event = verdict_event(STATE, verdict, arms, comparison, run)
    detail = event["detail"]
    assert detail["decision"] == "promote" and detail["candidate"]["drafters"] == ["model:retrained"]
    assert detail["candidate"]["acceptance_rate"] == 0.875 and detail["control"]["acceptance_rate"] == 0.0
    lines = verdict_lines(detail)
    assert lines[1].startswith("  control (model:current): acceptance 0.000, 9 requests, 0 errors, 16.0 ms/token")
    assert lines[2].startswith("  candidate (model:retrained): acceptance 0.875")
    assert lines[3].startswith("  speed-up 4.000x (control s/token / candidate s/token, per request), p=0.0001")
    annotations = annotations_of(EventRecord("edge", event["at"], "canary_verdict", detail, None))
    assert annotations["after"] == "candidate: 4 ms/token, 9 requests, model:retrained acceptance 0.875"


def test_a_gateway_whose_control_pool_does_not_draft_is_refused(capsys):
    upstreams = [
        f"cand=http://127.0.0.1:{free_port()},drafter=model:retrained",
        f"today=http://127.0.0.1:{free_port()}",
    ]
    with GatewayServer(upstreams, control_token="gw", name="edge") as gw:
        argv = ["draft", "canary", "--gateway", gw.url, "--control-token", "gw", "--collector", "http://127.0.0.1:9"]
        assert main(argv) == 2
        assert gw.gateway.router.state["canary"] is None  # nothing changed on the gateway
    assert "upstream(s) today name none" in capsys.readouterr().err
