"""Memory & power: fragmentation, memory held, energy per token, draft utilisation."""

import streamlit as st

from dashboard import charts
from dashboard.services import threshold_caption
from dashboard.state import empty_state, fetch, fmt, table, view

v = view()
st.title("Memory & power")
samples = fetch("device_series", v)
if samples.empty:
    empty_state(
        "No device samples in this window. The engine sends one every few seconds while it runs "
        "(`specwatch engine serve --collector ...`)."
    )
    st.stop()
lines = fetch("thresholds")
limit, swing_limit = lines.get("fragmentation"), lines.get("draft_util_swing")

latest = samples.iloc[-1]
cols = st.columns(4)
cols[0].metric(
    "Fragmentation (latest)",
    fmt(latest["fragmentation"]),
    limit and limit.versus(latest["fragmentation"], digits=2),
    delta_color="inverse",
)
cols[1].metric("Memory reserved", fmt(latest["mem_reserved_bytes"], " MiB", 1 / 2**20, 0))
estimated = latest["power_source"] == "estimate"
cols[2].metric(
    "Power" + (" (estimated)" if estimated else ""),
    fmt(latest["power_w"], " W", digits=1),
    help=f"source: {latest['power_source'] or 'none'}",
)
swing = (
    (samples["util_draft"].max() - samples["util_draft"].min()) * 100 if samples["util_draft"].notna().any() else None
)
cols[3].metric(
    "Draft utilisation swing",
    fmt(swing, " pp", digits=0),
    swing_limit and swing_limit.versus(swing, digits=0),
    delta_color="inverse",
    help="max − min of the draft's busy share; " + threshold_caption(lines, "draft_util_swing", "the swing"),
)

st.altair_chart(charts.line(samples, "fragmentation", "fragmentation", limit, color="instance"), width="stretch")
st.caption(threshold_caption(lines, "fragmentation", "fragmentation"))
defrags = fetch("events", v, "defrag")
if not defrags.empty:
    st.caption(
        f"{len(defrags)} defragmentations in this window, the latest at {defrags['time'].iloc[-1]:%H:%M:%S} UTC."
    )
memory = samples.melt(
    id_vars=["time"], value_vars=["mem_allocated_bytes", "mem_reserved_bytes"], var_name="kind", value_name="bytes"
)
memory["MiB"] = memory["bytes"] / 2**20
left, right = st.columns(2)
left.altair_chart(charts.line(memory, "MiB", "memory (MiB)", color="kind"), width="stretch")
right.altair_chart(charts.line(samples, "util_draft", "draft utilisation", color="instance"), width="stretch")

st.subheader("Power and energy per token")
st.altair_chart(
    charts.line(samples, "power_w", "power (W)" + (" — estimated" if estimated else ""), color="instance"),
    width="stretch",
)
energy = fetch("power_by_mode", v)
table(energy)
if (samples["power_source"] == "estimate").any() or energy.get("energy_source", []).astype(str).str.contains(
    "estimate"
).any():
    st.warning(
        "Some power and energy figures are **estimates** (no NVML or RAPL reading on this machine): "
        "this process's CPU-seconds x 12 W per busy core, a model, not a measurement.",
        icon="⚠️",
    )
