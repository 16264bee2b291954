"""Alerts: what fires now, what fired, what was done about it and who was told.

Each table leads with what a person reads (time, rule, state change, instance); ids, fingerprints and
raw labels sit in an expander under it."""

import streamlit as st

from specwatch.dashboard import reads
from specwatch.dashboard.state import table, view

INTERNALS = "Internals: ids, fingerprints, raw labels"


def with_internals(shown, internals) -> None:
    table(shown)
    with st.expander(INTERNALS):
        table(internals)


v = view()
st.title("Alerts")
alerts = reads.alerts()
cols = st.columns(3)
for col, state in zip(cols, ("firing", "pending", "inactive")):
    col.metric(state if state != "inactive" else "resolved (recently)", sum(a.state == state for a in alerts))
if alerts:
    with_internals([a.row() for a in alerts], [a.internals() for a in alerts])
else:
    st.success("No alert is pending or firing.")

history = reads.alert_history(v)
for part, title in (
    (history.transitions, "History"),
    (history.actions, "Actions taken"),
    (history.notifications, "Webhook deliveries"),
):
    st.subheader(title)
    if part.shown.empty:
        st.caption(f"No {title.lower()} in this window.")
    else:
        with_internals(part.shown, part.internals)

st.subheader("Rules")
rules = reads.rules()
if rules.empty:
    st.info("The collector evaluates no alert rules (alerting is off there, or its rules file has none).")
else:
    table(rules)
