"""The Cost page's charts that read the v3 cost model: the bill as a stacked bar, costs on discrete levels.

No streamlit here: frames in, altair charts out (the page draws them).
"""

from __future__ import annotations

import altair as alt
import pandas as pd

HEIGHT = 260


def bill_frame(allocation: dict | None) -> pd.DataFrame:
    """One row per part of the bill: each arm's work, retries, idle and other tenants (USD over the window)."""
    found: dict[str, float] = {}
    for line in (allocation or {}).get("lines", []):
        part = line["arm"] if line["kind"] == "arm" else line["kind"].replace("_", " ")
        found[part] = found.get(part, 0.0) + line["compute_usd"] + line["energy_usd"]
    return pd.DataFrame({"part": list(found), "usd": list(found.values()), "bill": "window"})


def bill_bar(frame: pd.DataFrame) -> alt.Chart:
    """Arms + retries + idle + other tenants stacked: together they are the bill."""
    return (
        alt.Chart(frame)
        .mark_bar()
        .encode(
            y=alt.Y("bill:N", title=None),
            x=alt.X("sum(usd):Q", title="USD over the window (Σ = the bill)"),
            color=alt.Color("part:N", title="line"),
            tooltip=["part:N", alt.Tooltip("usd:Q", format=",.4f")],
        )
        .properties(height=90)
    )


def by_level(frame: pd.DataFrame, crossover: int | None) -> alt.LayerChart:
    """$ per 1M tokens per concurrency level and mode; levels are discrete (1, 2, 4, ...), the crossover ruled."""
    frame = frame.assign(level=frame["level"].astype(int).astype(str))
    order = [str(v) for v in sorted({int(v) for v in frame["level"]})]
    x = alt.X("level:O", sort=order, title="concurrency level (requests in flight)")
    bars = (
        alt.Chart(frame)
        .mark_bar()
        .encode(
            x=x,
            xOffset="mode:N",
            y=alt.Y("usd_per_mtok:Q", title="$ / 1M output tokens"),
            color="mode:N",
            opacity=alt.condition("datum.enough", alt.value(1.0), alt.value(0.35)),
            tooltip=["level:O", "mode:N", "usd_per_mtok:Q", "usd_low:Q", "usd_high:Q", "requests:Q", "enough:N"],
        )
    )
    if crossover is None:
        return alt.layer(bars).properties(height=HEIGHT)
    rule = alt.Chart(pd.DataFrame({"level": [str(crossover)]})).mark_rule(strokeDash=[4, 4]).encode(x=x)
    return alt.layer(bars, rule).properties(height=HEIGHT)
