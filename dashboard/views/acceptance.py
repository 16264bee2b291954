"""Acceptance: where and why drafts are accepted or not."""

import streamlit as st

from specwatch.dashboard import charts, reads
from specwatch.dashboard.formats import as_markdown_text, p_is
from specwatch.dashboard.state import empty_state, fmt, table, view

v = view()
st.title("Acceptance")
over_time = reads.acceptance_series(v)
if over_time.empty or not over_time["draft_tokens"].sum():
    empty_state(
        "No speculative requests in this window: nothing was drafted. Try a longer window or "
        "`specwatch traffic --drafter ngram`."
    )
    st.stop()
lines = reads.thresholds()
floor = lines.get("acceptance_rate")

st.altair_chart(
    charts.line(
        over_time,
        "acceptance_rate",
        "acceptance rate",
        floor,
        band=("band_low", "band_high"),
        markers=reads.deploy_markers(v),
    ),
    width="stretch",
)
st.caption(
    "Line: accepted / drafted tokens per step. Band: mean ± 1 stddev of per-request acceptance. "
    "Dotted verticals: deploy markers (config events: version, model, drafter changes). "
    + lines.caption("acceptance_rate", "acceptance")
)

left, right = st.columns(2)
with left:
    st.subheader("Per draft position")
    st.altair_chart(
        charts.bars(reads.positions(v), "position", "acceptance", "draft position", "accepted through position"),
        width="stretch",
    )
with right:
    st.subheader("By drafter")
    by_drafter = reads.breakdown(v, "drafter")
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
    found = reads.length_points(v, by)
    within = reads.length_within_scenarios(v, by)
    st.subheader(f"Acceptance vs {label}")
    overall = (
        f"Spearman ρ = {fmt(found.rho, digits=3)} ({p_is(found.p_value)}) over {found.requests:,} requests that drafted"
    )
    if len(within) > 1:
        st.caption(
            f"{overall}, all scenarios together: **confounded** (scenarios differ in both {label} and "
            "acceptance). Within each scenario:"
        )
        table(within)
    elif v.tag or len(within):
        st.caption(f"{overall}, within {as_markdown_text(v.tag or 'scenario:' + within['scenario'][0])}")
    else:
        st.caption(f"{overall} (no scenario tags: it may mix kinds of traffic)")
    left, right = st.columns(2)
    left.altair_chart(
        charts.scatter(found.points, "length", "acceptance", f"{label} (tokens)", "acceptance rate"), width="stretch"
    )
    right.altair_chart(
        charts.bars(
            found.buckets.dropna(subset=["acceptance_rate"]),
            "bucket",
            "acceptance_rate",
            f"{label} (tokens)",
            "acceptance rate",
            floor,
        ),
        width="stretch",
    )

st.subheader("By scenario")
table(reads.breakdown(v, "tag:scenario"))
