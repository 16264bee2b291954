"""Alerts: what fires now, what fired, what was done about it and who was told."""

import streamlit as st

from specwatch.dashboard import reads
from specwatch.dashboard.state import table, view

v = view()
st.title("Alerts")
alerts = reads.alerts()
cols = st.columns(3)
for col, state in zip(cols, ("firing", "pending", "inactive")):
    col.metric(state if state != "inactive" else "resolved (recently)", sum(a.state == state for a in alerts))
if alerts:
    table([a.row() for a in alerts])
else:
    st.success("No alert is pending or firing.")

history = reads.alert_history(v)
for frame, title in (
    (history.transitions, "History"),
    (history.actions, "Actions taken"),
    (history.notifications, "Webhook deliveries"),
):
    st.subheader(title)
    if frame.empty:
        st.caption(f"No {title.lower()} in this window.")
    else:
        table(frame)

st.subheader("Rules")
rules = reads.rules()
if rules.empty:
    st.info("The collector evaluates no alert rules (alerting is off there, or its rules file has none).")
else:
    table(rules)
