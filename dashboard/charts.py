"""Altair charts with units on the axes and the collector's alert thresholds drawn (no Streamlit here).

Time axes are UTC and 24-hour (`%H:%M`; the date too when a chart spans more than a day). The UTC
comes from the scale (`type: utc`), which Vega-Lite's axis labels follow; an axis's `formatType: "utc"`
would make the Vega build Streamlit ships drop the format and fall back to its 12-hour default
("06 PM"), as tests/dashboard/test_browser.py saw rendered.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import altair as alt
import pandas as pd

if TYPE_CHECKING:
    from specwatch.dashboard.formats import Threshold

HEIGHT = 220
DAY = pd.Timedelta(days=1)
FEW_POINTS = 5  # a time series with fewer points is drawn as dots, and says so, not as a line


def time_format(times: pd.Series) -> str:
    """`%H:%M` within a day, with the date beyond; never 12-hour times."""
    return "%H:%M" if times.empty or times.max() - times.min() <= DAY else "%m-%d %H:%M"


def time_x(times: pd.Series, title: str = "time (UTC)", fmt: str | None = None) -> alt.X:
    """An x axis of the `time` column in UTC."""
    axis = alt.Axis(format=fmt or time_format(times), labelOverlap=True)  # UTC from the scale (module docstring)
    return alt.X("time:T", title=title, scale=alt.Scale(type="utc"), axis=axis)


def time_tooltip() -> alt.Tooltip:
    return alt.Tooltip("time:T", title="time (UTC)", format="%Y-%m-%d %H:%M:%S", formatType="utc")


def _markers(events: pd.DataFrame, x: alt.X) -> alt.Chart:
    """A grey vertical line at each event's `time` (defragmentations, deploys) on the time axis `x`."""
    rule = alt.Chart(events[["time"]]).mark_rule(color="#7f7f7f", strokeDash=[2, 2])
    return rule.encode(x=x, tooltip=[time_tooltip()])


def _threshold(line: Threshold) -> alt.LayerChart:
    frame = pd.DataFrame({"y": [line.value], "label": [line.label]})
    rule = alt.Chart(frame).mark_rule(color="#d62728", strokeDash=[6, 4]).encode(y="y:Q")
    text = alt.Chart(frame).mark_text(align="left", dx=4, dy=-6, color="#d62728").encode(y="y:Q", text="label:N")
    return rule + text


def line(
    frame: pd.DataFrame,
    y: str,
    title: str,
    threshold: Threshold | None = None,
    band: tuple[str, str] | None = None,
    color: str | None = None,
    markers: pd.DataFrame | None = None,
) -> alt.Chart:
    """A time series (x = `time`, UTC), optionally with a rule's threshold line, a shaded band (low,
    high columns) and `markers`: a vertical line at each `time` of that frame (events, deploys)."""
    times = frame.get("time", pd.Series(dtype="datetime64[ns, UTC]"))
    x = time_x(times)
    encoding = {"x": x, "y": alt.Y(f"{y}:Q", title=title)}
    if color:
        encoding["color"] = alt.Color(f"{color}:N")
    few = times.nunique() < FEW_POINTS
    base = alt.Chart(frame, title=_few_title(times.nunique()) if few else alt.Undefined)
    chart = (base.mark_point(filled=True, size=60) if few else base.mark_line(point=True)).encode(
        **encoding, tooltip=[time_tooltip(), f"{y}:Q"]
    )
    layers = [chart]
    if band:
        layers.insert(0, alt.Chart(frame).mark_area(opacity=0.2).encode(x=x, y=f"{band[0]}:Q", y2=f"{band[1]}:Q"))
    if threshold is not None:
        layers.append(_threshold(threshold))
    if markers is not None and not markers.empty:
        layers.append(_markers(markers, x))
    return alt.layer(*layers).properties(height=HEIGHT)


def _few_title(points: int) -> alt.TitleParams:
    said = "no point" if points == 0 else f"only {points} point{'s' if points > 1 else ''}"
    return alt.TitleParams(f"{said} in this window so far: too few for a line", fontSize=11, fontWeight="normal")


def bars(
    frame: pd.DataFrame,
    x: str,
    y: str,
    x_title: str,
    y_title: str,
    threshold: Threshold | None = None,
) -> alt.Chart:
    chart = (
        alt.Chart(frame)
        .mark_bar()
        .encode(
            x=alt.X(f"{x}:O", title=x_title, sort=None),  # the frame's order: buckets low to high, not as text
            y=alt.Y(f"{y}:Q", title=y_title),
            tooltip=[f"{x}:O", f"{y}:Q"],
        )
    )
    layers = [chart] + ([_threshold(threshold)] if threshold is not None else [])
    return alt.layer(*layers).properties(height=HEIGHT)


def cdf(frame: pd.DataFrame, metric: str, threshold: Threshold | None = None) -> alt.Chart:
    """Quantile curves per group for one metric (x: milliseconds, y: share of requests), and a
    seconds `threshold` as a vertical line."""
    data = frame[frame["metric"] == metric]
    chart = (
        alt.Chart(data)
        .mark_line(point=True)
        .encode(
            x=alt.X("ms:Q", title=f"{metric} (ms)"),
            y=alt.Y("quantile:Q", title="share of requests"),
            color="group:N",
            tooltip=["group:N", "quantile:Q", "ms:Q"],
        )
    )
    if threshold is None:
        return chart.properties(height=HEIGHT)
    line = pd.DataFrame({"x": [threshold.value * 1000], "label": [threshold.label]})
    rule = alt.Chart(line).mark_rule(color="#d62728", strokeDash=[6, 4]).encode(x="x:Q")
    text = alt.Chart(line).mark_text(align="left", dx=4, y=8, color="#d62728").encode(x="x:Q", text="label:N")
    return alt.layer(chart, rule, text).properties(height=HEIGHT)


def daily_cost(frame: pd.DataFrame) -> alt.Chart:
    """$ per 1M output tokens per UTC day, one line per arm; the tooltip says whether it is an estimate."""
    return (
        alt.Chart(frame)
        .mark_line(point=True)
        .encode(
            x=time_x(frame["time"], "day (UTC)", "%Y-%m-%d"),
            y=alt.Y("usd_per_mtok:Q", title="$ / 1M output tokens"),
            color=alt.Color("arm:N"),
            tooltip=["day:N", "arm:N", "usd_per_mtok:Q", "gpu_hours_per_mtok:Q", "requests:Q", "estimated:N"],
        )
        .properties(height=HEIGHT)
    )


def cost_by_concurrency(frame: pd.DataFrame, crossover: int | None) -> alt.LayerChart:
    """$ per 1M output tokens against concurrency level, one line per mode, the crossover as a rule."""
    lines = (
        alt.Chart(frame)
        .mark_line(point=True)
        .encode(
            x=alt.X("level:Q", title="concurrency (requests in flight)", scale=alt.Scale(type="log", base=2)),
            y=alt.Y("usd_per_mtok:Q", title="$ / 1M output tokens"),
            color=alt.Color("mode:N"),
            tooltip=["level:Q", "mode:N", "usd_per_mtok:Q", "gpu_hours_per_mtok:Q", "requests:Q"],
        )
    )
    if crossover is None:
        return alt.layer(lines).properties(height=HEIGHT)
    rule = alt.Chart(pd.DataFrame({"level": [crossover]})).mark_rule(strokeDash=[4, 4]).encode(x="level:Q")
    return alt.layer(lines, rule).properties(height=HEIGHT)


def scatter(frame: pd.DataFrame, x: str, y: str, x_title: str, y_title: str, color: str | None = None) -> alt.Chart:
    encoding = {"x": alt.X(f"{x}:Q", title=x_title), "y": alt.Y(f"{y}:Q", title=y_title)}
    if color:
        encoding["color"] = alt.Color(f"{color}:N")
    return alt.Chart(frame).mark_circle(size=40, opacity=0.6).encode(**encoding).properties(height=HEIGHT)


def break_even(curves: pd.DataFrame, measured: list[tuple[str, float]]) -> alt.LayerChart:
    """Modelled speed-up against per-token acceptance α, the 1× line, and the measured α per arm."""
    chart = (
        alt.Chart(curves)
        .mark_line()
        .encode(
            x=alt.X("acceptance:Q", title="per-token acceptance α"),
            y=alt.Y("speed-up:Q", title="speed-up (×)"),
            color="arm:N",
        )
    )
    one = alt.Chart(pd.DataFrame({"y": [1.0]})).mark_rule(color="#d62728", strokeDash=[6, 4]).encode(y="y:Q")
    marks = (
        alt.Chart(pd.DataFrame(measured, columns=["arm", "acceptance"]))
        .mark_rule(strokeWidth=2)
        .encode(x="acceptance:Q", color="arm:N")
    )
    return alt.layer(chart, one, marks).properties(height=HEIGHT)


def tornado(rows: pd.DataFrame) -> alt.Chart:
    """Net monthly benefit with each input at -20% and +20% (widest swing on top)."""
    return (
        alt.Chart(rows)
        .mark_bar()
        .encode(
            y=alt.Y("name:N", sort=None, title=None, axis=alt.Axis(labelLimit=400)),  # whole input names
            x=alt.X("net_at_low:Q", title="net benefit $/month"),
            x2="net_at_high:Q",
            tooltip=["name:N", "low:Q", "high:Q", "net_at_low:Q", "net_at_high:Q"],
        )
        .properties(height=HEIGHT)
    )


def bill_stack(parts: pd.DataFrame) -> alt.Chart:
    """The window's bill as one horizontal bar stacked by what makes it up (arms, retries, idle, ...)."""
    return (
        alt.Chart(parts.assign(bill="bill"))
        .mark_bar(size=32)
        .encode(
            x=alt.X("usd:Q", title="$ in this window", stack="zero"),
            y=alt.Y("bill:N", title=None, axis=None),
            color=alt.Color("part:N", title="part of the bill", legend=alt.Legend(orient="right")),
            tooltip=["part:N", alt.Tooltip("usd:Q", format="$,.4f"), "estimate:N"],
        )
        .properties(height=110)  # room for the legend of 4-5 parts
    )
