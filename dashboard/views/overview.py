"""Overview: is speculation paying off right now?"""

import streamlit as st

from dashboard import charts
from dashboard.services import ACCEPTANCE_FLOOR, TTFT_SLO_S
from dashboard.state import empty_state, fetch, fmt, view

v = view()
st.title("Overview")
o = fetch("overview", v)
if not o["requests"]:
    empty_state()
    st.stop()

row = st.columns(4)
row[0].metric(
    "Requests/s", fmt(o["requests_per_s"], digits=3), help=f"{o['requests']:,} requests, {o['errors']} errors"
)
row[1].metric("Output tokens/s", fmt(o["output_tokens_per_s"], digits=1))
row[2].metric("Speculative share", fmt(o["speculative_share"], "%", 100, 0))
speedup_label = "Speed-up (by mode, biased)" if o["speedup_biased"] else "Speed-up (A/B arms)"
row[3].metric(
    speedup_label,
    fmt(o["speedup"], "×"),
    help=f"plain latency per token / speculative latency per token; Mann-Whitney p = {fmt(o['speedup_p_value'], digits=4)}",
)
row = st.columns(4)
rate = o["acceptance_rate"]
row[0].metric(
    "Acceptance rate", fmt(rate, digits=3), None if rate is None else f"{rate - ACCEPTANCE_FLOOR:+.3f} vs 0.6"
)
row[1].metric("Mean acceptance length", fmt(o["mean_acceptance_length"]))
row[2].metric("Output from accepted drafts", fmt(o["accepted_share_of_output"], "%", 100, 1))
row[3].metric("Drafts/s", fmt(o["drafts_per_s"], digits=2))
row = st.columns(4)
row[0].metric("Drafted tokens/s", fmt(o["draft_tokens_per_s"], digits=1))
row[1].metric("Accepted tokens/s", fmt(o["accepted_tokens_per_s"], digits=1))
row[2].metric("TTFT P50", fmt(o["ttft_p50"], " ms", 1000, 0))
p99 = o["ttft_p99"]
row[3].metric(
    "TTFT P99",
    fmt(p99, " ms", 1000, 0),
    None if p99 is None else f"{(p99 - TTFT_SLO_S) * 1000:+.0f} ms vs 300 ms",
    delta_color="inverse",
)

series = fetch("series", v)
left, right = st.columns(2)
left.altair_chart(charts.line(series, "acceptance_rate", "acceptance rate", ACCEPTANCE_FLOOR, "0.6"), width="stretch")
right.altair_chart(charts.line(series, "ttft_p99", "TTFT P99 (s)", TTFT_SLO_S, "300 ms"), width="stretch")

st.subheader(f"Alerts: {o['firing']} firing, {o['pending']} pending")
if o["active_alerts"]:
    st.dataframe(
        [
            {
                "state": a["state"],
                "rule": a["rule"],
                "summary": a["annotations"].get("summary", ""),
                "value": a["value"],
            }
            for a in o["active_alerts"]
        ],
        hide_index=True,
        width="stretch",
    )
