"""Latency & throughput: does speculation make requests faster, and up to what load?"""

import streamlit as st

from specwatch.dashboard import charts, reads
from specwatch.dashboard.formats import p_value
from specwatch.dashboard.state import empty_state, fmt, table, view

v = view()
st.title("Latency & throughput")
over_time = reads.series(v)
if over_time.empty or not over_time["requests"].sum():
    empty_state()
    st.stop()
lines = reads.thresholds()
slo = lines.get("ttft_p99")

left, middle, right = st.columns(3)
left.altair_chart(charts.line(over_time, "ttft_p99", "TTFT P99 (s)", slo), width="stretch")
left.caption(lines.caption("ttft_p99", "TTFT P99"))
middle.altair_chart(charts.line(over_time, "tpot_p99", "TPOT P99 (s)"), width="stretch")
middle.caption("TPOT: time per output token after the first.")
right.altair_chart(charts.line(over_time, "e2e_p99", "end-to-end P99 (s)"), width="stretch")

c = reads.compare(v)
st.subheader("Speculative vs plain")
if c.speculative and c.plain:
    sides = c.groups
    cols = st.columns(4)
    cols[0].metric("Speed-up per token", fmt(c.speedup, "×"))
    cols[1].metric("Mann-Whitney U p", p_value(c.p_value), c.significance, delta_color="off")
    cols[2].metric("Speculative ms/token (P50)", fmt(c.speculative.s_per_token.p50, " ms", 1000, 1))
    cols[3].metric("Plain ms/token (P50)", fmt(c.plain.s_per_token.p50, " ms", 1000, 1))
    st.caption(
        " · ".join(f"{g.key}: {g.requests:,} requests, {fmt(g.request_rate_per_s, ' req/s', digits=3)}" for g in sides)
        + (
            ". From the A/B arms (spec vs control)."
            if not c.biased
            else ". No A/B arms in this window: all speculative vs all plain requests, which is biased when the "
            "policy chose the mode by load or prompt length. Run with `--canary-fraction` for an unbiased comparison."
        )
    )
else:
    st.info("Both speculative and plain requests are needed for a comparison.")

cdfs = reads.cdfs(v, "mode")
left, right = st.columns(2)
left.altair_chart(charts.cdf(cdfs, "TTFT", slo), width="stretch")
right.altair_chart(charts.cdf(cdfs, "latency per token"), width="stretch")

st.subheader("Throughput vs load (the knee)")
by_load = reads.throughput_by_load(v)
if by_load.empty:
    st.info("No request recorded its load at admission in this window (the bundled engine does).")
else:
    st.altair_chart(
        charts.scatter(by_load, "low", "tokens_per_s", "load at admission", "tokens/s per request", color="mode"),
        width="stretch",
    )
    st.caption("One dot per load level and mode: where tokens/s per request falls as load rises is the knee.")
    table(by_load)
