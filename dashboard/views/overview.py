"""Overview: is speculation paying off right now?"""

import streamlit as st

from dashboard import charts
from dashboard.formats import duration
from dashboard.services import threshold_caption
from dashboard.state import empty_state, fetch, fmt, table, view

v = view()
st.title("Overview")
o = fetch("overview", v)
if not o["requests"]:
    empty_state()
    st.stop()
lines = fetch("thresholds")
acceptance_line, ttft_line = lines.get("acceptance_rate"), lines.get("ttft_p99")

over = f"over the {duration(o['span_s'])} of the window that hold requests"
row = st.columns(4)
row[0].metric(
    "Requests/s",
    fmt(o["requests_per_s"], digits=3),
    help=f"{o['requests']:,} requests, {o['errors']} errors; rates {over}",
)
row[1].metric("Output tokens/s", fmt(o["output_tokens_per_s"], digits=1), help=over)
row[2].metric("Speculative share", fmt(o["speculative_share"], "%", 100, 0))
speedup_label = "Speed-up (by mode, biased)" if o["speedup_biased"] else "Speed-up (A/B arms)"
row[3].metric(
    speedup_label,
    fmt(o["speedup"], "×"),
    help="plain latency per token / speculative latency per token; "
    f"Mann-Whitney p = {fmt(o['speedup_p_value'], digits=4)}",
)
row = st.columns(4)
rate = o["acceptance_rate"]
row[0].metric("Acceptance rate", fmt(rate, digits=3), acceptance_line and acceptance_line.versus(rate))
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
    ttft_line and ttft_line.versus(p99),
    delta_color="inverse",
)

series = fetch("series", v)
left, right = st.columns(2)
left.altair_chart(charts.line(series, "acceptance_rate", "acceptance rate", acceptance_line), width="stretch")
left.caption(threshold_caption(lines, "acceptance_rate", "acceptance"))
right.altair_chart(charts.line(series, "ttft_p99", "TTFT P99 (s)", ttft_line), width="stretch")
right.caption(threshold_caption(lines, "ttft_p99", "TTFT P99"))

st.subheader(f"Alerts: {o['firing']} firing, {o['pending']} pending")
if o["active_alerts"]:
    table(
        [
            {
                "state": a["state"],
                "rule": a["rule"],
                "summary": a["annotations"].get("summary", ""),
                "value": a["value"],
            }
            for a in o["active_alerts"]
        ]
    )
