"""Requests: find single requests (filters, sort, pages) and open one (per-position acceptance, timings,
device time, tags, anomaly flags)."""

import streamlit as st

from specwatch.dashboard import charts, paging, reads
from specwatch.dashboard.formats import as_markdown_text
from specwatch.dashboard.requests_service import FLAGS, SORTS, STATUSES, RequestFilter
from specwatch.dashboard.state import empty_state, fmt, table, view

v = view()
st.title("Requests")
for line in reads.speculation_activity(v).inactive:  # their requests carry no draft counts to list
    st.warning(line, icon="⏸️")
cols = st.columns(4)
sort = cols[0].selectbox("Sort", list(SORTS), key="requests_sort")
status = cols[1].selectbox("Status", ["all", *STATUSES], key="requests_status")
flag = cols[2].selectbox("Flag", ["all", *FLAGS], key="requests_flag")
limit = cols[3].selectbox("Rows per page", [25, 50, 100, 200], index=1, key="requests_limit")
chosen = RequestFilter(sort, None if status == "all" else status, None if flag == "all" else flag, limit)

found = reads.request_list(v, chosen, paging.cursor((v, chosen)))
if found.rows.empty:
    empty_state("No request in this window matches these filters.")
    st.stop()
table(found.rows)
paging.buttons(found.next_cursor)

picked = st.selectbox("Open a request", ["—", *found.rows["request_id"]], key="requests_open")
if picked == "—":
    st.stop()
detail = reads.request_detail(picked)
st.subheader(f"Request {as_markdown_text(detail.request_id)}")
row = st.columns(len(detail.summary))
for col, (label, value) in zip(row, detail.summary.items()):
    col.metric(label, fmt(value, digits=3) if isinstance(value, float) else fmt(value, digits=0))
left, right = st.columns(2)
with left:
    st.altair_chart(
        charts.bars(detail.positions, "position", "acceptance", "draft position", "accepted through position"),
        width="stretch",
    )
with right:
    table(detail.timings)
left, right = st.columns(2)
with left:
    st.caption("Tags")
    table(detail.tags)
with right:
    st.caption("Anomaly flags")
    if detail.flags.empty:
        st.caption("none")
    else:
        table(detail.flags)
