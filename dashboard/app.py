"""specwatch dashboard: `streamlit run dashboard/app.py` (or `specwatch dashboard`).

The router: global filters in the sidebar, then the selected page. Pages hold no logic;
they call `dashboard.state.fetch` (cached `dashboard.services` calls to the collector).
"""

from __future__ import annotations

from pathlib import Path

import streamlit as st

from specwatch.dashboard.state import sidebar

PAGES = (
    Path(__file__).resolve().parent / "views"
)  # not "pages": Streamlit would also treat that as an old-style multipage app

st.set_page_config(page_title="specwatch", page_icon="📈", layout="wide")
navigation = st.navigation(
    [
        st.Page(PAGES / "overview.py", title="Overview", icon="📊", default=True),
        st.Page(PAGES / "acceptance.py", title="Acceptance", icon="🎯"),
        st.Page(PAGES / "latency.py", title="Latency & throughput", icon="⏱️"),
        st.Page(PAGES / "memory.py", title="Memory & power", icon="🔋"),
        st.Page(PAGES / "requests.py", title="Requests", icon="🔎"),
        st.Page(PAGES / "alerts.py", title="Alerts", icon="🚨"),
        st.Page(PAGES / "cost.py", title="Cost", icon="💲"),
        st.Page(PAGES / "sources.py", title="Sources", icon="🛰️"),
        st.Page(PAGES / "tuning.py", title="Tuning", icon="🎛️"),
    ]
)
st.session_state["view"] = sidebar()
navigation.run()
