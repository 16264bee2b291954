"""Sources: which engines, gateways (with their upstreams' health) and vLLM servers report, and how much."""

import pandas as pd
import streamlit as st

from dashboard.state import empty_state, fetch, fmt, table, view

ENGINE_COLUMNS = ["kind", "name", "last_seen", "records_in_window", "per_s"]
NO_GATEWAY = (
    "No gateway has reported; start one with `specwatch gateway serve --upstream URL --collector "
    "http://127.0.0.1:8087`. Its upstreams' health shows here from its first report."
)


def health(row: pd.Series) -> str:
    """ "up", "down: <reason>", or "unknown" when the snapshot did not say."""
    if pd.isna(row["healthy"]):
        return "unknown"
    reason = row["reason"] if isinstance(row["reason"], str) and row["reason"] else "no reason given"
    return "up" if bool(row["healthy"]) else f"down: {reason}"


def upstream_table(upstreams: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "upstream": upstreams["name"],
            "pool": upstreams["pool"],
            "drafter": upstreams["drafter"].fillna("none"),
            "health": upstreams.apply(health, axis=1),
            "requests": upstreams["records_in_window"],
            "req/s": upstreams["per_s"],
            "last health report": upstreams["reported"],
        }
    )


def gateways_section(found: pd.DataFrame) -> None:
    st.subheader("Gateways and upstreams")
    gateways = found[found["kind"] == "gateway"] if not found.empty else found
    if gateways.empty:
        empty_state(NO_GATEWAY)
        return
    for gateway in gateways.itertuples():
        upstreams = found[(found["kind"] == "upstream") & (found["gateway"] == gateway.name)]
        down = sum(health(row).startswith("down") for _, row in upstreams.iterrows())
        st.markdown(f"**{gateway.name}**: {len(upstreams)} upstreams, {down} down")
        st.caption(
            f"last health report {gateway.reported:%Y-%m-%d %H:%M:%S} UTC; {gateway.records_in_window} requests "
            f"in this window ({fmt(gateway.per_s, ' req/s')}), counting those no upstream took"
        )
        if upstreams.empty:
            empty_state(f"Gateway {gateway.name} reported no upstreams.")
        else:
            table(upstream_table(upstreams))


v = view()
st.title("Sources")
found = fetch("sources", v)
direct = found[found["kind"].isin(["engine", "vllm"])] if not found.empty else found
st.subheader("Engines and vLLM servers")
if direct.empty:
    empty_state(
        "No engine or vLLM server has reported in this window. Start one with `specwatch engine serve "
        "--collector http://127.0.0.1:8087`, or scrape vLLM with `specwatch collector serve --scrape-vllm URL`."
    )
else:
    table(direct[ENGINE_COLUMNS])
gateways_section(found)
vllm = fetch("vllm_signals", v)
if vllm["intervals"]:
    st.subheader("vLLM (scraped /metrics)")
    cols = st.columns(3)
    cols[0].metric("Acceptance rate", fmt(vllm["acceptance_rate"], digits=3))
    cols[1].metric("Mean acceptance length", fmt(vllm["mean_acceptance_length"]))
    cols[2].metric("TTFT P99", fmt(vllm["ttft"]["p99"], " ms", 1000, 0))
