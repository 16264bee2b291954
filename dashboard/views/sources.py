"""Sources: which engines and vLLM servers report, and how much."""

import streamlit as st

from dashboard.state import empty_state, fetch, fmt, table, view

v = view()
st.title("Sources")
found = fetch("sources", v)
if found.empty:
    empty_state(
        "No engine or vLLM server has reported in this window. Start one with `specwatch engine serve "
        "--collector http://127.0.0.1:8087`, or scrape vLLM with `specwatch collector serve --scrape-vllm URL`."
    )
    st.stop()
table(found)
vllm = fetch("vllm_signals", v)
if vllm["intervals"]:
    st.subheader("vLLM (scraped /metrics)")
    cols = st.columns(3)
    cols[0].metric("Acceptance rate", fmt(vllm["acceptance_rate"], digits=3))
    cols[1].metric("Mean acceptance length", fmt(vllm["mean_acceptance_length"]))
    cols[2].metric("TTFT P99", fmt(vllm["ttft"]["p99"], " ms", 1000, 0))
