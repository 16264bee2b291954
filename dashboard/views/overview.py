"""Overview: is speculation paying off right now?"""

import streamlit as st

from specwatch.dashboard import charts, reads
from specwatch.dashboard.formats import duration, p_is
from specwatch.dashboard.state import empty_state, fmt, table, verdict_panel, view

v = view()
st.title("Overview")
o = reads.overview(v)
s = o.signals
if not s.requests:
    empty_state()
    st.stop()
verdict_panel(reads.cost(v).summary.get("verdict"))
for line in reads.speculation_activity(v).inactive:  # speculation configured but not drafting
    st.warning(line, icon="⏸️")
lines = reads.thresholds()
acceptance_line, ttft_line = lines.get("acceptance_rate"), lines.get("ttft_p99")

over = f"per second of the {duration(s.active_s)} of the window that hold requests (the collector's rates)"
row = st.columns(4)
row[0].metric(
    "Requests/s",
    fmt(s.request_rate_per_s, digits=3),
    help=f"{s.requests:,} requests, {s.errors} errors; {over}",
)
row[1].metric("Output tokens/s", fmt(s.output_tokens_per_s, digits=1), help=over)
row[2].metric("Speculative share", fmt(o.speculative_share, "%", 100, 0))
c = o.comparison
row[3].metric(
    "Speed-up (by mode, biased)" if c.biased else "Speed-up (A/B arms)",
    fmt(c.speedup, "×"),
    help=f"plain latency per token / speculative latency per token; Mann-Whitney {p_is(c.p_value)}",
)
row = st.columns(4)
rate = s.acceptance_rate
row[0].metric("Acceptance rate", fmt(rate, digits=3), acceptance_line and acceptance_line.versus(rate))
row[1].metric("Mean acceptance length", fmt(s.mean_acceptance_length))
row[2].metric("Output from accepted drafts", fmt(s.accepted_share_of_output, "%", 100, 1))
row[3].metric("Drafts/s", fmt(s.per_s(s.drafts), digits=2), help=over)
row = st.columns(4)
row[0].metric("Drafted tokens/s", fmt(s.per_s(s.draft_tokens), digits=1), help=over)
row[1].metric("Accepted tokens/s", fmt(s.per_s(s.accepted_tokens), digits=1), help=over)
row[2].metric("TTFT P50", fmt(s.ttft.p50, " ms", 1000, 0))
p99 = s.ttft.p99
row[3].metric("TTFT P99", fmt(p99, " ms", 1000, 0), ttft_line and ttft_line.versus(p99), delta_color="inverse")

over_time = reads.series(v)
left, right = st.columns(2)
deploys = reads.deploy_markers(v)
left.altair_chart(
    charts.line(over_time, "acceptance_rate", "acceptance rate", acceptance_line, markers=deploys), width="stretch"
)
left.caption(lines.caption("acceptance_rate", "acceptance") + " Dotted verticals: deploy markers (config events).")
right.altair_chart(charts.line(over_time, "ttft_p99", "TTFT P99 (s)", ttft_line, markers=deploys), width="stretch")
right.caption(lines.caption("ttft_p99", "TTFT P99"))

st.subheader(f"Alerts: {o.count('firing')} firing, {o.count('pending')} pending")
if o.alerts:
    table([a.row() for a in o.alerts])
