"""Acceptance: where and why drafts are accepted or not."""

import streamlit as st

from dashboard import charts
from dashboard.services import threshold_caption
from dashboard.state import empty_state, fetch, fmt, table, view

v = view()
st.title("Acceptance")
over_time = fetch("acceptance_series", v)
if over_time.empty or not over_time["draft_tokens"].sum():
    empty_state(
        "No speculative requests in this window: nothing was drafted. Try a longer window or "
        "`specwatch traffic --drafter ngram`."
    )
    st.stop()
lines = fetch("thresholds")
floor = lines.get("acceptance_rate")

st.altair_chart(
    charts.line(over_time, "acceptance_rate", "acceptance rate", floor, band=("band_low", "band_high")),
    width="stretch",
)
st.caption(
    "Line: accepted / drafted tokens per step. Band: mean ± 1 stddev of per-request acceptance. "
    + threshold_caption(lines, "acceptance_rate", "acceptance")
)

left, right = st.columns(2)
with left:
    st.subheader("Per draft position")
    st.altair_chart(
        charts.bars(fetch("positions", v), "position", "acceptance", "draft position", "accepted through position"),
        width="stretch",
    )
with right:
    st.subheader("By drafter")
    by_drafter = fetch("breakdown", v, "drafter")
    st.altair_chart(
        charts.bars(
            by_drafter.dropna(subset=["acceptance_rate"]),
            "group",
            "acceptance_rate",
            "drafter",
            "acceptance rate",
            floor,
        ),
        width="stretch",
    )

for by, label in (("prompt_tokens", "prompt length"), ("output_tokens", "output length")):
    stats, buckets, points = fetch("length_points", v, by)
    st.subheader(f"Acceptance vs {label}")
    st.caption(
        f"Spearman ρ = {fmt(stats['rho'], digits=3)} (p = {fmt(stats['p'], digits=4)}) over {stats['requests']:,} "
        "requests that drafted"
    )
    left, right = st.columns(2)
    left.altair_chart(
        charts.scatter(points, "length", "acceptance", f"{label} (tokens)", "acceptance rate"), width="stretch"
    )
    right.altair_chart(
        charts.bars(
            buckets.dropna(subset=["acceptance_rate"]),
            "bucket",
            "acceptance_rate",
            f"{label} (tokens)",
            "acceptance rate",
            floor,
        ),
        width="stretch",
    )

st.subheader("By scenario")
table(fetch("breakdown", v, "tag:scenario"))
