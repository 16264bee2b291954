"""Is speculation drafting? The collector's `GET /v1/speculation/activity` for the Overview and Sources
pages (no streamlit here): per instance configured to speculate, the drafted step fraction and when it last
drafted. The answer covers every tenant, so a tenant-bound token gets nothing (and the pages say so)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

import pandas as pd

from specwatch.dashboard.api import CollectorRefused, View, get


@dataclass(frozen=True)
class Activity:
    rows: pd.DataFrame = field(default_factory=pd.DataFrame)
    inactive: tuple[str, ...] = ()  # one line per inactive instance: name, share and when it stopped
    refused: bool = False  # the token may not read across tenants


def speculation_activity(view: View) -> Activity:
    try:
        found = get("/v1/speculation/activity", view.params(with_filters=False))
    except CollectorRefused:
        return Activity(refused=True)
    rows = [_row(a) for a in found["instances"]]
    lines = tuple(_line(a, found["min_fraction"]) for a in found["instances"] if a["inactive"])
    return Activity(pd.DataFrame(rows), lines)


def _when(epoch: float | None) -> str:
    return "not within a day" if epoch is None else f"{datetime.fromtimestamp(epoch, UTC):%Y-%m-%d %H:%M:%S} UTC"


def _row(a: dict) -> dict:
    fraction = a["drafted_step_fraction"]
    return {
        "instance": a["instance"],
        "configured by": ", ".join(a["evidence"]),
        "drafted steps": None if fraction is None else f"{fraction:.1%}",
        "inactive": "yes" if a["inactive"] else "no",
        "last drafted": _when(a["last_drafted_at"]),
        # lossy or forced acceptance (config): the acceptance alerts and the drift detector skip it
        "acceptance": {"lossy": "lossy: alerts skip it", "forced": "forced: alerts skip it"}.get(
            a.get("acceptance_mode"), "as measured"
        ),
    }


def _line(a: dict, min_fraction: float) -> str:
    return (
        f"**{a['instance']}** is configured to speculate but drafted on {a['drafted_step_fraction']:.1%} of its "
        f"decode steps (below {min_fraction:.0%}); last drafted {_when(a['last_drafted_at'])}. Its acceptance "
        "figures are stale: the acceptance alerts skip it."
    )
