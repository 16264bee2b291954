"""Latency & throughput: does speculation make requests faster, and up to what load?"""

import streamlit as st

from dashboard import charts
from dashboard.services import threshold_caption
from dashboard.state import empty_state, fetch, fmt, table, view

v = view()
st.title("Latency & throughput")
over_time = fetch("series", v)
if over_time.empty or not over_time["requests"].sum():
    empty_state()
    st.stop()
lines = fetch("thresholds")
slo = lines.get("ttft_p99")

left, middle, right = st.columns(3)
left.altair_chart(charts.line(over_time, "ttft_p99", "TTFT P99 (s)", slo), width="stretch")
left.caption(threshold_caption(lines, "ttft_p99", "TTFT P99"))
middle.altair_chart(charts.line(over_time, "tpot_p99", "time per output token P99 (s)"), width="stretch")
right.altair_chart(charts.line(over_time, "e2e_p99", "end-to-end P99 (s)"), width="stretch")

comparison = fetch("compare", v)
st.subheader("Speculative vs plain")
spec, plain = comparison["speculative"], comparison["plain"]
if spec and plain:
    cols = st.columns(4)
    cols[0].metric("Speed-up per token", fmt(comparison["speedup"], "×"))
    cols[1].metric(
        "Mann-Whitney U p",
        fmt(comparison["p_value"], digits=4),
        "significant" if (comparison["p_value"] or 1) < 0.05 else "not significant",
        delta_color="off",
    )
    cols[2].metric("Speculative ms/token (P50)", fmt(spec["s_per_token"]["p50"], " ms", 1000, 1))
    cols[3].metric("Plain ms/token (P50)", fmt(plain["s_per_token"]["p50"], " ms", 1000, 1))
    st.caption(
        "From the A/B arms (spec vs control)."
        if not comparison["biased"]
        else "No A/B arms in this window: all speculative vs all plain requests, which is biased when the policy "
        "chose the mode by load or prompt length. Run with `--canary-fraction` for an unbiased comparison."
    )
else:
    st.info("Both speculative and plain requests are needed for a comparison.")

cdfs = fetch("cdfs", v, "mode")
left, right = st.columns(2)
left.altair_chart(charts.cdf(cdfs, "TTFT", slo), width="stretch")
right.altair_chart(charts.cdf(cdfs, "latency per token"), width="stretch")

st.subheader("Throughput vs load (the knee)")
by_load = fetch("throughput_by_load", v)
if by_load.empty:
    st.info("No request recorded its load at admission in this window (the bundled engine does).")
else:
    st.altair_chart(
        charts.scatter(
            by_load, "low", "tokens_per_s", "load at admission", "tokens/s per request", color="mode"
        ).mark_line(point=True),
        width="stretch",
    )
    table(by_load)
