"""Streamlit glue shared by the pages: the sidebar's `View`, cached service calls, banners.

`cached(service)` caches a service for `TTL_S` seconds per arguments, so moving between pages
or re-running a page does not hit the collector again (`dashboard.reads` lists the pages' reads).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import pandas as pd
import streamlit as st

from specwatch.dashboard import formats, services
from specwatch.dashboard.api import CollectorRefused, CollectorUnavailable, View, collector_url
from specwatch.dashboard.formats import as_markdown_text, usd

P = ParamSpec("P")
T = TypeVar("T")

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


def cached(service: Callable[P, T]) -> Callable[P, T]:
    """`service` cached for TTL_S seconds per arguments; a collector problem becomes a banner and stops the page."""
    read = st.cache_data(ttl=TTL_S, show_spinner=False)(service)

    @functools.wraps(service)
    def guarded(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return read(*args, **kwargs)
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

    return guarded


def clear_cache() -> None:
    """Forget every cached read (the Refresh button, tests, the bench)."""
    st.cache_data.clear()


_filter_options = st.cache_data(ttl=TTL_S, show_spinner=False)(services.filter_options)


def filter_options(seconds: float) -> services.FilterOptions:
    """The sidebar's choices; none (not a banner: the page shows that) when the collector fails."""
    try:
        return _filter_options(seconds)
    except CollectorUnavailable:
        return services.FilterOptions()


def empty_state(message: str = EMPTY) -> None:
    st.info(message, icon="ℹ️")


def sidebar() -> View:
    """Render the global filters and return what they select."""
    with st.sidebar:
        label = st.selectbox("Time window", list(WINDOWS), index=0, key="window")
        seconds = float(WINDOWS[label])
        options = filter_options(seconds)
        picks = {
            name: _pick(name, title, getattr(options, name))
            for name, title in (("instance", "Instance"), ("model", "Model"), ("drafter", "Drafter"))
        }
        picks["mode"] = _pick("mode", "Mode", ("speculative", "autoregressive"))
        picks["arm"] = _pick("arm", "A/B arm", ("spec", "control"))
        picks["tag"] = _pick("tag", "Scenario", options.tag)
        if st.button("Refresh", width="stretch"):
            clear_cache()
        st.caption(f"collector: {collector_url()}")
    return View(seconds, **picks)


def _pick(key: str, title: str, values: tuple[str, ...]) -> str | None:
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


def verdict_panel(verdict: dict | None) -> None:
    """The verdict's sentence (cost.verdict, the same on every view), the figures behind it one click away."""
    if not verdict:
        return
    st.markdown(f"**{as_markdown_text(verdict['sentence'])}**")
    with st.expander("The figures behind the verdict"):
        table([{"figure": f, "value": v, "basis": b} for f, v, b in _verdict_figures(verdict)])


def _verdict_figures(v: dict) -> list[tuple[str, str, str]]:
    estimate = "~" if v["fixed_estimate"] else ""
    volume = f"measured, at {v['monthly_tokens']:,.0f} tokens/month ({v['volume_source']})"
    knee_missing = "none" if v["knee_measured"] else "not measured"
    return [
        ("latency speed-up, per request", fmt(v["latency_speedup"], "×"), v["latency_basis"] or "not measured"),
        ("device throughput, speculative / plain", fmt(v["throughput_ratio"], "×"), "measured"),
        ("speculative $ / 1M tokens", usd(v["spec_usd_per_mtok"]), "measured"),
        ("plain $ / 1M tokens", usd(v["plain_usd_per_mtok"]), "measured"),
        ("saving / month", usd(v["saving_usd_per_month"]), volume),
        (
            "fixed costs / month",
            estimate + usd(v["fixed_usd_per_month"]),
            "estimate: " + ", ".join(v["fixed_from"]) if estimate else "given",
        ),
        (
            "pays above (tokens / month)",
            estimate + fmt(v["break_even_tokens_per_month"], digits=0, missing="never while it costs more per token"),
            "fixed costs / saving per token",
        ),
        ("knee (concurrency)", fmt(v["knee"], digits=0, missing=knee_missing), "cost per token by concurrency level"),
    ]
