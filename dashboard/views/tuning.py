"""Tuning: the k per batch size that maximises output tokens/s, from the window's records (`GET /v1/tune`)."""

import streamlit as st

from specwatch.dashboard import reads
from specwatch.dashboard.formats import as_markdown_text
from specwatch.dashboard.state import empty_state, table, view
from specwatch.dashboard.tuning_charts import tuning_curves

v = view()
st.title("Speculation tuning")
st.caption(
    "Per batch-size bucket: expected tokens per step from per-position acceptance, over the step cost t(b, k); "
    "k = 0 is plain decoding. Buckets without enough data keep today's k. Intervals: 95% bootstrap of the "
    "acceptance data. See docs/tuning.md."
)
max_batch = st.number_input("server's max_num_seqs", min_value=1, max_value=4096, value=256, step=1)
found = reads.tuning(v, int(max_batch))
if found.stale:
    st.warning(f"Stale: {as_markdown_text(found.stale)}")
cols = st.columns(3)
cols[0].metric("today's k", found.found["today_k"])
cols[1].metric("recommended max k", found.found["max_k"])
cols[2].metric("buckets with enough data", sum(b["enough"] for b in found.found["buckets"]))
if found.curves.empty:
    empty_state("No bucket has enough speculative requests and step-cost data in this window to predict tokens/s.")
else:
    st.altair_chart(tuning_curves(found.curves), width="stretch")
table(found.buckets)
st.subheader("Emitted configuration")
st.code(found.found["vllm_argument"] or "no speculation: start vLLM without --speculative-config", language="bash")
st.code(f"draft_len_schedule: {found.found['trtllm_draft_len_schedule']}", language="yaml")
for what, named in (("acceptance", "Acceptance"), ("step_cost", "Step cost")):
    st.caption(f"{named} from: {as_markdown_text('; '.join(found.found['sources'][what]) or 'no bucket had data')}")
for note in found.found["notes"]:
    st.caption(as_markdown_text(note))
