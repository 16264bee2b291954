"""Alerts: what fires now, what fired, what was done about it and who was told."""

import streamlit as st

from dashboard.state import fetch, table, view

v = view()
st.title("Alerts")
current = fetch("alerts")
alerts = current["alerts"]
cols = st.columns(3)
for col, state in zip(cols, ("firing", "pending", "inactive")):
    col.metric(state if state != "inactive" else "resolved (recently)", sum(a["state"] == state for a in alerts))
if alerts:
    table(
        [
            {
                "state": a["state"],
                "rule": a["rule"],
                "summary": a["annotations"].get("summary", ""),
                "labels": ", ".join(f"{k}={v}" for k, v in a["labels"].items() if k not in ("alertname", "severity")),
                "severity": a["labels"].get("severity"),
                "value": a["value"],
            }
            for a in alerts
        ]
    )
else:
    st.success("No alert is pending or firing.")

history = fetch("alert_history", v)
for name, title in (("transitions", "History"), ("actions", "Actions taken"), ("notifications", "Webhook deliveries")):
    st.subheader(title)
    frame = history[name]
    if frame.empty:
        st.caption(f"No {title.lower()} in this window.")
    else:
        table(frame)

st.subheader("Rules")
rules = fetch("rules")
if rules.empty:
    st.info("The collector evaluates no alert rules (alerting is off there, or its rules file has none).")
else:
    table(rules)
