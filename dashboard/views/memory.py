"""Memory & power: fragmentation, memory held, energy per token, draft utilisation."""

import streamlit as st

from specwatch.dashboard import charts, reads
from specwatch.dashboard.formats import as_markdown_text
from specwatch.dashboard.state import empty_state, fmt, table, view

v = view()
st.title("Memory & power")
d = reads.devices(v)
if d.empty:
    empty_state(
        "No device samples in this window. The engine sends one every few seconds while it runs "
        "(`specwatch engine serve --collector ...`)."
    )
    st.stop()
lines = reads.thresholds()
limit, swing_limit = lines.get("fragmentation"), lines.get("draft_util_swing")

# on a CPU the sampler's ratio is the glibc heap's (arena + mmap) / in use: no allocator cache to defragment
on_cpu = bool(d.samples["device"].eq("cpu").all())
cols = st.columns(4)
cols[0].metric(
    "Heap ratio (latest; fragmentation not applicable on CPU)" if on_cpu else "Fragmentation (latest)",
    fmt(d.fragmentation),
    limit and limit.versus(d.fragmentation, digits=2),
    delta_color="inverse",
    help="(arena + mmap) / in-use bytes of the glibc heap; MemoryFragmentationHigh reads a CUDA allocator's "
    "reserved / allocated and does not apply here"
    if on_cpu
    else "reserved / allocated memory of the CUDA caching allocator",
)
cols[1].metric("Memory reserved", fmt(d.reserved_mib, " MiB", digits=0))
estimated = d.power_source == "estimate"
cols[2].metric(
    "Power" + (" (estimated)" if estimated else ""),
    fmt(d.power_w, " W", digits=1),
    help=f"source: {as_markdown_text(d.power_source or 'none')}",
)
cols[3].metric(
    "Draft utilisation swing",
    fmt(d.draft_swing_pp, " pp", digits=0),
    swing_limit and swing_limit.versus(d.draft_swing_pp, digits=0),
    delta_color="inverse",
    help="max − min of the draft's busy share; " + lines.caption("draft_util_swing", "the swing"),
)

defrags = reads.events(v, "defrag")
st.altair_chart(
    charts.line(
        d.samples,
        "fragmentation",
        "heap ratio (CPU)" if on_cpu else "fragmentation",
        limit,
        color="instance",
        markers=defrags,
    ),
    width="stretch",
)
st.caption(lines.caption("fragmentation", "fragmentation"))
if not defrags.empty:
    st.caption(
        f"{len(defrags)} defragmentations in this window (grey lines), the latest at "
        f"{defrags['time'].iloc[-1]:%H:%M:%S} UTC."
    )
left, right = st.columns(2)
left.altair_chart(charts.line(d.memory, "MiB", "memory (MiB)", color="kind"), width="stretch")
right.altair_chart(charts.line(d.samples, "util_draft", "draft utilisation", color="instance"), width="stretch")

st.subheader("Power and energy per token")
st.altair_chart(
    charts.line(d.samples, "power_w", "power (W)" + (" — estimated" if estimated else ""), color="instance"),
    width="stretch",
)
sampled = reads.sampled_energy(v)
marked = " (estimate)" if sampled.estimated else ""
st.metric(
    "Energy per output token" + marked,
    fmt(sampled.per_token, " J", digits=3, missing="not measured (no power readings)"),
    help="Σ device power x sampling interval / output tokens in the window, all modes together",
)
energy = reads.power_by_mode(v)
table(energy.table)
st.caption(
    "Per mode, from the records' own energy where producers send it (the bundled engine does not: 'not metered')."
)
if d.power_estimated or energy.estimated:
    st.warning(
        "Some power and energy figures are **estimates** (no NVML or RAPL reading on this machine): "
        "this process's CPU-seconds x 12 W per busy core, a model, not a measurement.",
        icon="⚠️",
    )
