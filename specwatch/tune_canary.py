"""`specwatch tune canary`: prove a candidate config on live traffic, then promote it or roll back.

specwatch tune canary --gateway URL --control-token T --collector URL [--collector-token T] [--read-token T]
    [--share 0.05] [--min-requests 20] [--max-minutes 30] [--alpha 0.05] [--max-load-gap 0.25] [--poll 2] [--json]

The gateway's spec pool is the candidate (an upstream started with the recommended config), its plain pool
today's config (which may speculate too: `pool=plain` with a drafter). The command sets the gateway's live
canary share (`POST /v1/control/canary`), waits (with a progress line) until each arm has `--min-requests`
ok requests in the collector or `--max-minutes` pass, compares the arms (`GET /v1/compare?by=arm`: the
Mann-Whitney test on per-request s/token) at matched load (each pool's load sampled from the gateway's
state meanwhile), decides (`specwatch.alerts.canary_verdict`), promotes (share 1) or rolls back (share 0), and
records a `canary_verdict` event through the collector's ingest API; the collector's alert runner turns
it into an alert-history entry and an Alertmanager webhook (`alerts.canary`). Ctrl-C rolls back.
The verdict states each arm's drafters and its acceptance on the canary's traffic beside the speed-up
(`specwatch draft canary`, specwatch/draft_canary.py, runs this with both arms drafting).
Bad input, an unreachable service or a refused token exit 2; a verdict that could not be applied or
recorded exits 1.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import asdict, dataclass, field
from urllib.parse import urlsplit

import httpx

from specwatch.alerts.canary_verdict import Arm, CanaryRules, Verdict, decide
from specwatch.common.auth import first_token
from specwatch.common.errors import UsageError

REASON = "specwatch tune canary"
ARMS = {"spec": "candidate", "control": "control"}
POOLS = {"candidate": "spec", "control": "plain"}


def _share(value: str) -> float:
    try:
        share = float(value)
    except ValueError:
        share = -1.0
    if not 0.0 < share < 1.0:
        raise argparse.ArgumentTypeError(f"want a share strictly between 0 and 1 (both arms need traffic): {value!r}")
    return share


def _positive(kind):
    def parse(value: str):
        try:
            number = kind(value)
        except ValueError:
            number = 0
        if not number > 0:
            raise argparse.ArgumentTypeError(f"want a positive number, got {value!r}")
        return number

    return parse


def _token(variable: str) -> str | None:
    return first_token(os.environ.get(variable))


def register_canary(actions: argparse._SubParsersAction) -> None:
    canary = actions.add_parser("canary", help="send a share of traffic to the candidate, then promote or roll back")
    add_canary_arguments(canary)
    canary.set_defaults(handler=canary_command)


def add_canary_arguments(canary: argparse.ArgumentParser) -> None:
    """The options `tune canary` and `draft canary` share."""
    add = canary.add_argument
    add("--gateway", required=True, help="the gateway's base URL (its spec pool is the candidate)")
    add("--control-token", default=os.environ.get("SPECWATCH_CONTROL_TOKEN"), help="the gateway's admin token "
        "(default: SPECWATCH_CONTROL_TOKEN)")  # fmt: skip
    add("--collector", default=os.environ.get("SPECWATCH_COLLECTOR_URL"), help="the collector's base URL "
        "(default: SPECWATCH_COLLECTOR_URL)")  # fmt: skip
    add("--collector-token", default=_token("SPECWATCH_INGEST_TOKEN"), help="default: SPECWATCH_INGEST_TOKEN")
    add("--read-token", default=_token("SPECWATCH_READ_TOKEN"), help="default: SPECWATCH_READ_TOKEN")
    add("--share", type=_share, default=0.05, help="the candidate's share of traffic (default 0.05)")
    add("--min-requests", type=_positive(int), default=CanaryRules.min_requests, help="ok requests per arm (20)")
    add("--max-minutes", type=_positive(float), default=30.0, help="longest wait for them (default 30)")
    add("--alpha", type=float, default=CanaryRules.alpha, help="significance level (default 0.05)")
    add("--max-load-gap", type=float, default=CanaryRules.max_load_gap, help="most the arms' mean loads may differ")
    add("--poll", type=_positive(float), default=2.0, help="seconds between progress reads (default 2)")
    add("--json", action="store_true", help="print the verdict event's detail as JSON")


def _base_url(name: str, url: str | None) -> str:
    parts = urlsplit(url or "")
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise UsageError(f"--{name}: want an http(s)://HOST[:PORT] URL, got {url!r}")
    return url.rstrip("/")


def rules_of(args: argparse.Namespace) -> CanaryRules:
    try:
        return CanaryRules(args.alpha, args.min_requests, args.max_load_gap)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


@dataclass
class Loads:
    """Each pool's mean load (its healthy upstreams' mean), sampled from the gateway's state."""

    samples: dict[str, list[float]] = field(default_factory=lambda: {"spec": [], "plain": []})

    def add(self, state: dict) -> None:
        for pool, values in self.samples.items():
            loads = [u["load"] for u in state["upstreams"] if u["pool"] == pool and u["healthy"]]
            if loads:
                values.append(sum(loads) / len(loads))

    def mean(self, pool: str) -> float | None:
        values = self.samples[pool]
        return sum(values) / len(values) if values else None


class Canary:
    """The gateway's control API and the collector's query and ingest APIs, over one HTTP client."""

    def __init__(self, args: argparse.Namespace, http: httpx.Client) -> None:
        self.gateway, self.collector = _base_url("gateway", args.gateway), _base_url("collector", args.collector)
        self.args, self.http = args, http
        self.control = {"authorization": f"Bearer {args.control_token}"} if args.control_token else {}

    def _call(self, what: str, method: str, url: str, **kwargs) -> httpx.Response:
        try:
            response = self.http.request(method, url, **kwargs)
        except httpx.HTTPError as exc:
            raise UsageError(f"{what}: cannot reach {url} ({type(exc).__name__}: {exc})") from None
        if response.status_code in (401, 403):
            raise UsageError(f"{what}: {url} refused the token ({response.status_code}): {response.text[:200]}")
        return response

    def state(self) -> dict:
        response = self._call("gateway", "GET", f"{self.gateway}/v1/control/state", headers=self.control)
        if response.status_code != 200:
            raise UsageError(f"gateway: /v1/control/state answered {response.status_code}: {response.text[:200]}")
        return response.json()

    def set_share(self, share: float, reason: str) -> bool:
        body = {"share": share, "reason": reason}
        response = self._call("gateway", "POST", f"{self.gateway}/v1/control/canary", json=body, headers=self.control)
        return response.status_code == 200

    def compare(self, start: float) -> dict:
        params = {"by": "arm", "start": start, "end": time.time() + 1.0}
        headers = {"authorization": f"Bearer {self.args.read_token}"} if self.args.read_token else {}
        response = self._call("collector", "GET", f"{self.collector}/v1/compare", params=params, headers=headers)
        if response.status_code != 200:
            raise UsageError(f"collector: /v1/compare answered {response.status_code}: {response.text[:200]}")
        return response.json()

    def record(self, event: dict) -> bool:
        token = self.args.collector_token
        headers = {"authorization": f"Bearer {token}"} if token else {}
        url = f"{self.collector}/v1/ingest"
        return self._call("collector", "POST", url, json={"events": [event]}, headers=headers).is_success


def check_pools(state: dict) -> None:
    pools = {u["pool"] for u in state["upstreams"]}
    if not {"spec", "plain"} <= pools:
        raise UsageError(
            "the gateway needs a spec pool (the candidate) and a plain pool (today's config); it has "
            f"{', '.join(sorted(pools)) or 'no upstreams'}"
        )


def arms_of(comparison: dict, loads: Loads) -> dict[str, Arm]:
    """candidate / control figures from a /v1/compare?by=arm answer and the sampled loads."""
    groups = {"candidate": comparison.get("speculative"), "control": comparison.get("plain")}
    return {
        name: Arm(g["requests"], g["errors"], g["s_per_token_mean"], loads.mean(POOLS[name]))
        if g
        else Arm(load=loads.mean(POOLS[name]))
        for name, g in groups.items()
    }


def progress(elapsed: float, arms: dict[str, Arm], need: int) -> str:
    parts = [f"{name} {arm.ok}/{need} ok" + (f" (load {arm.load:.2f})" if arm.load is not None else "")
             for name, arm in arms.items()]  # fmt: skip
    return f"canary {elapsed:5.0f} s: " + ", ".join(parts)


def wait_for_arms(canary: Canary, start: float, rules: CanaryRules) -> tuple[dict[str, Arm], dict]:
    """Poll until each arm has `min_requests` ok requests or `--max-minutes` pass; the last reading."""
    loads, deadline, shown = Loads(), time.monotonic() + canary.args.max_minutes * 60.0, None
    while True:
        loads.add(canary.state())
        comparison = canary.compare(start)
        arms = arms_of(comparison, loads)
        line = progress(time.time() - start, arms, rules.min_requests)
        if line.split(":", 1)[1] != shown:
            print(line, file=sys.stderr, flush=True)
            shown = line.split(":", 1)[1]
        if min(a.ok for a in arms.values()) >= rules.min_requests or time.monotonic() >= deadline:
            return arms, comparison
        time.sleep(canary.args.poll)


def pool_members(state: dict, pool: str) -> dict[str, list]:
    """A pool's upstreams and the drafters they serve (None: plain decoding), from the gateway's state."""
    members = [u for u in state["upstreams"] if u["pool"] == pool][:8]
    return {"upstreams": [u["name"] for u in members], "drafters": sorted({u["drafter"] or "none" for u in members})}


def acceptance_of(group: dict | None) -> dict:
    """An arm's acceptance on the canary's traffic (accepted / drafted tokens; None: nothing drafted)."""
    group = group or {}
    return {key: group.get(key) for key in ("acceptance_rate", "mean_acceptance_length", "drafted", "accepted")}


def verdict_event(state: dict, verdict: Verdict, arms: dict[str, Arm], comparison: dict, run: dict) -> dict:
    """The `canary_verdict` event (the ingest API's EngineEvent), `instance` the gateway's name."""
    groups = {"candidate": comparison.get("speculative"), "control": comparison.get("plain")}
    detail = {
        "decision": verdict.decision,
        "reason": verdict.reason[:400],
        "p_value": comparison.get("p_value"),
        "speedup": comparison.get("speedup"),
        **{
            name: {**arm.as_detail(), **acceptance_of(groups[name]), **pool_members(state, POOLS[name])}
            for name, arm in arms.items()
        },
        **run,
    }
    return {"instance": state["name"], "at": time.time(), "kind": "canary_verdict", "detail": detail}


def run_canary(canary: Canary, rules: CanaryRules, reason: str = REASON, check=check_pools) -> tuple[dict, bool]:
    """Set the share, wait, decide, act on the gateway, record the verdict; (the event, all went through).
    `reason`: the command, in the gateway's log of share changes; `check(state)` refuses a gateway whose
    pools cannot serve this canary."""
    state = canary.state()
    check(state)
    start = time.time()
    if not canary.set_share(canary.args.share, reason):
        raise UsageError(f"gateway: refused the canary share {canary.args.share}")
    try:
        arms, comparison = wait_for_arms(canary, start, rules)
    except KeyboardInterrupt:
        canary.set_share(0.0, f"{reason}: interrupted, rolled back")
        raise
    verdict = decide(arms["candidate"], arms["control"], comparison.get("speedup"), comparison.get("p_value"), rules)
    applied = canary.set_share(verdict.share_after, f"{reason}: {verdict.decision}")
    run = {
        "share": {"from": canary.args.share, "to": verdict.share_after},
        "applied": applied,
        "window": {"start": start, "end": time.time()},
        "rules": asdict(rules),
    }
    event = verdict_event(state, verdict, arms, comparison, run)
    return event, applied and canary.record(event)


def canary_command(args: argparse.Namespace, reason: str = REASON, check=check_pools) -> int:
    """Run the canary and print its verdict (`--json`: the event's detail); `reason` and `check` as `run_canary`."""
    rules = rules_of(args)
    with httpx.Client(timeout=10.0, trust_env=False) as http:
        event, done = run_canary(Canary(args, http), rules, reason, check)
    detail = event["detail"]
    print(json.dumps(detail, indent=2) if args.json else "\n".join(verdict_lines(detail)))
    if not done:
        print("the verdict was not applied on the gateway or not recorded in the collector", file=sys.stderr)
    return 0 if done else 1


def _figure(value, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def verdict_lines(detail: dict) -> list[str]:
    """The verdict for a terminal: each arm's drafters, acceptance and speed on the canary's traffic."""
    lines = [f"verdict: {detail['decision']} ({detail['reason']})"]
    for name in ("control", "candidate"):
        arm = detail[name]
        lines.append(
            f"  {name} ({', '.join(arm['drafters']) or 'no upstream'}): acceptance "
            f"{_figure(arm['acceptance_rate'], '.3f')}, {arm['requests']} requests, {arm['errors']} errors, "
            f"{arm['ms_per_token']} ms/token"
        )
    lines.append(
        f"  speed-up {_figure(detail['speedup'], '.3f')}x (control s/token / candidate s/token, per request), "
        f"p={_figure(detail['p_value'], '.3g')}"
    )
    share = detail["share"]
    lines.append(f"  share {share['from']} -> {share['to']}: {'applied' if detail['applied'] else 'REFUSED'}")
    return lines
