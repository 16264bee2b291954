"""Streamlit glue shared by the pages: the sidebar's `View`, cached service calls, banners.

Service calls are cached for `TTL_S` seconds per (function, arguments), so moving between
pages or re-running a page does not hit the collector again.
"""

from __future__ import annotations

import time

import pandas as pd
import streamlit as st

from dashboard import formats, services
from dashboard.services import CollectorRefused, CollectorUnavailable, View

TTL_S = 10
# The default is the shortest: what a fresh `specwatch up` has after a few minutes fills it.
WINDOWS = {
    "last 15 minutes": 900,
    "last hour": 3600,
    "last 6 hours": 6 * 3600,
    "last 24 hours": 86400,
    "last 7 days": 7 * 86400,
    "last 30 days": 30 * 86400,
}
EMPTY = (
    "No telemetry in this window. Send some with `specwatch traffic --url http://127.0.0.1:8000` "
    "(or run `specwatch up`)."
)


@st.cache_data(ttl=TTL_S, show_spinner=False)
def _cached(name: str, *args):
    return getattr(services, name)(*args)


def fetch(name: str, *args):
    """services.<name>(*args), cached; a collector problem becomes a banner and stops the page."""
    try:
        return _cached(name, *args)
    except CollectorRefused as exc:
        st.error(f"**The collector refused the dashboard's token.** {exc}", icon="🔒")
        st.stop()
    except CollectorUnavailable as exc:
        st.error(
            f"**Collector unavailable.** {exc}\n\nStart it with `specwatch collector serve` "
            f"(or set SPECWATCH_COLLECTOR_URL), then press *Refresh*.",
            icon="🚫",
        )
        st.stop()


def empty_state(message: str = EMPTY) -> None:
    st.info(message, icon="ℹ️")


def sidebar() -> View:
    """Render the global filters and return what they select."""
    with st.sidebar:
        label = st.selectbox("Time window", list(WINDOWS), index=0, key="window")
        seconds = float(WINDOWS[label])
        try:
            options = _cached("filter_options", seconds)
        except CollectorUnavailable:
            options = {"instance": [], "model": [], "drafter": [], "tag": []}
        picks = {
            name: _pick(name, title, options.get(name, []))
            for name, title in (("instance", "Instance"), ("model", "Model"), ("drafter", "Drafter"))
        }
        picks["mode"] = _pick("mode", "Mode", ["speculative", "autoregressive"])
        picks["arm"] = _pick("arm", "A/B arm", ["spec", "control"])
        picks["tag"] = _pick("tag", "Scenario", options.get("tag", []))
        if st.button("Refresh", width="stretch"):
            st.cache_data.clear()
        st.caption(f"collector: {services.collector_url()}")
    return View(seconds, **picks)


def _pick(key: str, title: str, values: list[str]) -> str | None:
    choice = st.selectbox(title, ["all", *values], key=f"filter_{key}")
    return None if choice == "all" else choice


def view() -> View:
    return st.session_state.get("view", View())


def table(frame: pd.DataFrame | list[dict]) -> None:
    """A table whose empty cells say what is missing and whose "$" columns print as dollars."""
    frame = pd.DataFrame(frame)
    money = tuple(column for column in frame.columns if "$" in str(column))
    st.dataframe(formats.styled(frame, money), hide_index=True, width="stretch")


def fmt(value: float | None, unit: str = "", scale: float = 1.0, digits: int = 2, missing: str = "—") -> str:
    return missing if value is None else f"{value * scale:,.{digits}f}{unit}"


def this_month() -> str:
    return time.strftime("%Y-%m", time.gmtime())
