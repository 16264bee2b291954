"""Sources: which engines, gateways (with their upstreams' health) and vLLM servers report, and how much."""

import streamlit as st

from specwatch.dashboard import reads
from specwatch.dashboard.formats import as_markdown_text
from specwatch.dashboard.state import empty_state, fmt, table, view

NO_GATEWAY = (
    "No gateway has reported; start one with `specwatch gateway serve --upstream URL --collector "
    "http://127.0.0.1:8087`. Its upstreams' health shows here from its first report."
)

v = view()
st.title("Sources")
found = reads.sources(v)
st.subheader("Engines and vLLM servers")
if found.direct.empty:
    empty_state(
        "No engine or vLLM server has reported in this window. Start one with `specwatch engine serve "
        "--collector http://127.0.0.1:8087`, or scrape vLLM with `specwatch collector serve --scrape-vllm URL`."
    )
else:
    table(found.direct)

st.subheader("Gateways and upstreams")
if not found.gateways:
    empty_state(NO_GATEWAY)
for gateway in found.gateways:
    name = as_markdown_text(gateway.name)
    st.markdown(f"**{name}**: {len(gateway.upstreams)} upstreams, {gateway.down} down")
    st.caption(
        f"last health report {gateway.reported:%Y-%m-%d %H:%M:%S} UTC; {gateway.requests} requests "
        f"in this window ({fmt(gateway.per_s, ' req/s')}), counting those no upstream took"
    )
    if gateway.upstreams.empty:
        empty_state(f"Gateway {name} reported no upstreams.")
    else:
        table(gateway.upstreams)

activity = reads.speculation_activity(v)
st.subheader("Speculation activity")
for line in activity.inactive:
    st.warning(line, icon="⏸️")
if activity.refused:
    empty_state("Speculation activity covers every tenant: this dashboard's token may not read it.")
elif activity.rows.empty:
    empty_state("No instance configured to speculate has reported in this window.")
else:
    table(activity.rows)

vllm = reads.vllm_signals(v)
if vllm.intervals:
    st.subheader("vLLM (scraped /metrics)")
    cols = st.columns(3)
    cols[0].metric("Acceptance rate", fmt(vllm.acceptance_rate, digits=3))
    cols[1].metric("Mean acceptance length", fmt(vllm.mean_acceptance_length))
    cols[2].metric("TTFT P99", fmt(vllm.ttft_p99, " ms", 1000, 0))
