"""`specwatch draft canary`: a retrained draft against the current one on live traffic, then promote or roll back.

specwatch draft canary --gateway URL --control-token T --collector URL [the options of `tune canary`]

`tune canary` with both arms speculating: the gateway's spec pool serves the retrained drafter (the candidate),
its plain pool today's drafter (`--upstream today=URL,drafter=model:current,pool=plain`). Every upstream of
both pools must name its drafter, so that the records of each arm carry it. The verdict is the tuner's
(`specwatch.alerts.canary_verdict`: the Mann-Whitney test on per-request s/token at matched load); the
output and the recorded `canary_verdict` event's detail add each arm's drafters and its acceptance on the
canary's traffic (accepted / drafted tokens), beside the speed-up (control s/token / candidate s/token).
"""

from __future__ import annotations

import argparse

from specwatch.common.errors import UsageError
from specwatch.tune_canary import add_canary_arguments, canary_command

REASON = "specwatch draft canary"


def register_draft_canary(commands: argparse._SubParsersAction) -> None:
    canary = commands.add_parser(
        "canary", help="canary a retrained draft (spec pool) against the current one (plain pool), promote or roll back"
    )
    add_canary_arguments(canary)
    canary.set_defaults(handler=lambda args: canary_command(args, REASON, check_drafters))


def check_drafters(state: dict) -> None:
    """Both pools present, and every upstream in them drafting: a draft canary compares two drafters."""
    pools = {pool: [u for u in state["upstreams"] if u["pool"] == pool] for pool in ("spec", "plain")}
    if not all(pools.values()):
        raise UsageError(
            "a draft canary needs a spec pool (the retrained drafter) and a plain pool (the current drafter); the "
            f"gateway has {', '.join(sorted({u['pool'] for u in state['upstreams']})) or 'no upstreams'}"
        )
    if plain := [u["name"] for members in pools.values() for u in members if not u["drafter"]]:
        raise UsageError(
            f"a draft canary compares two drafters, but upstream(s) {', '.join(plain)} name none: give each "
            "`--upstream NAME=URL,drafter=model:NAME` (the current drafter's with `pool=plain`)"
        )
