"""How the dashboard prints money, rule thresholds and missing values, and the lines its charts draw."""

from __future__ import annotations

import pandas as pd
import pytest

from specwatch.dashboard import charts, formats
from specwatch.dashboard.formats import Threshold


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        (64.9541, "$64.95"),
        (0.0, "$0.00"),
        (0.5, "$0.50"),
        (0.004213, "$0.0042"),
        (1234.5, "$1.2k"),
        (-3456.0, "-$3.5k"),
        (2_500_000.0, "$2.5M"),
        (None, "—"),
    ],
)
def test_usd(value, shown):
    assert formats.usd(value) == shown


def test_threshold_labels_and_distance_follow_the_rules_value():
    slo = Threshold("TTFTP99High", "ttft_p99", ">", 1.0, "seconds")
    assert slo.label == "1 s"
    assert Threshold("TTFTP99High", "ttft_p99", ">", 0.3, "seconds").label == "300 ms"
    assert slo.versus(1.25) == "+250 ms vs 1 s"
    assert slo.versus(None) is None and slo.versus(float("nan")) is None
    assert Threshold("SpecAcceptanceLow", "acceptance_rate", "<", 0.45, "ratio").versus(0.5) == "+0.050 vs 0.45"


def test_a_charts_threshold_line_is_drawn_at_the_rules_value():
    frame = pd.DataFrame({"time": pd.to_datetime([0, 60], unit="s", utc=True), "ttft_p99": [0.2, 0.4]})
    drawn = charts.line(frame, "ttft_p99", "TTFT P99 (s)", Threshold("R", "ttft_p99", ">", 1.5, "seconds")).to_dict()
    assert {"y": 1.5, "label": "1.5 s"} in [row for rows in drawn["datasets"].values() for row in rows]
    assert len(charts.line(frame, "ttft_p99", "TTFT P99 (s)").to_dict()["layer"]) == 1  # no rule: no line


def x_axis(chart) -> dict:
    """The x encoding of a chart's first layer, as Vega-Lite gets it."""
    spec = chart.to_dict()
    return (spec["layer"][0] if "layer" in spec else spec)["encoding"]["x"]


def test_time_axes_are_24_hour_utc():
    minutes = pd.DataFrame({"time": pd.to_datetime([0, 3600 * 16 + 49 * 60], unit="s", utc=True), "v": [1, 2]})
    x = x_axis(charts.line(minutes, "v", "v"))
    assert (x["axis"]["format"], x["scale"]["type"]) == ("%H:%M", "utc") and "formatType" not in x["axis"]
    days = minutes.assign(time=pd.to_datetime([0, 3 * 86400], unit="s", utc=True))
    assert x_axis(charts.line(days, "v", "v"))["axis"]["format"] == "%m-%d %H:%M"  # the date once it spans days
    assert x_axis(charts.line(pd.DataFrame(), "v", "v"))["axis"]["format"] == "%H:%M"


def test_markers_draw_a_line_at_each_event():
    frame = pd.DataFrame({"time": pd.to_datetime([0, 60], unit="s", utc=True), "v": [1.0, 2.0]})
    events = pd.DataFrame({"time": pd.to_datetime([30], unit="s", utc=True), "kind": ["defrag"]})
    layers = charts.line(frame, "v", "v", markers=events).to_dict()["layer"]
    assert [layer["mark"]["type"] for layer in layers] == ["point", "rule"]  # two points: dots, no line
    assert len(charts.line(frame, "v", "v", markers=events.iloc[:0]).to_dict()["layer"]) == 1


def test_empty_cells_say_what_is_missing():
    frame = pd.DataFrame({"energy_source": [None, "nvml"], "ttft_p99_ms": [None, 12.5], "monthly $": [None, 1500.0]})
    html = formats.styled(frame, money=("monthly $",)).to_html()
    assert "not metered" in html and "not measured" in html and "$1.5k" in html and "None" not in html


@pytest.mark.parametrize(("p", "shown"), [(1.5e-7, "< 0.0001"), (0.0, "< 0.0001"), (0.0312, "0.0312"), (None, "—")])
def test_p_values_below_four_decimals_say_so(p, shown):
    assert formats.p_value(p) == shown
    assert formats.p_is(p) == (f"p {shown}" if shown.startswith("<") else f"p = {shown}")


def test_tables_print_thousands_separators():
    html = formats.styled(pd.DataFrame({"tokens": [75429713.06244761]})).to_html()
    assert "75,429,713.062" in html and "75429713" not in html


def test_bucket_bars_keep_the_frames_order():
    buckets = pd.DataFrame({"bucket": ["0–64", "64–128", "128–1024", "1024–∞"], "rate": [0.1, 0.2, 0.3, 0.4]})
    x = x_axis(charts.bars(buckets, "bucket", "rate", "prompt length", "acceptance"))
    assert "sort" in x and x["sort"] is None  # Vega-Lite's "no sort": the data's order, not alphabetical


def test_a_time_series_with_few_points_is_dots_that_say_so():
    few = pd.DataFrame({"time": pd.to_datetime([0, 60, 120], unit="s", utc=True), "v": [1.0, 2.0, 3.0]})
    layer = charts.line(few, "v", "v").to_dict()["layer"][0]
    assert layer["mark"]["type"] == "point" and "only 3 points" in layer["title"]["text"]
    many = few.assign(time=pd.to_datetime([0, 60, 120], unit="s", utc=True))
    many = pd.concat([many, many.assign(time=many["time"] + pd.Timedelta(minutes=5))])
    layer = charts.line(many, "v", "v").to_dict()["layer"][0]
    assert layer["mark"]["type"] == "line" and "title" not in layer


def test_the_bill_is_the_sum_of_its_stacked_parts():
    from specwatch.dashboard.cost_service import window_bill

    line = {"compute_usd": 0.0, "energy_usd": 0.0, "estimate": False}
    lines = [
        line | {"kind": "arm", "arm": "spec-ngram", "compute_usd": 0.30},
        line | {"kind": "arm", "arm": "control", "compute_usd": 0.10, "energy_usd": 0.01},
        line | {"kind": "idle", "arm": None, "compute_usd": 0.09, "estimate": True},
    ]
    bills = [{"compute_usd": 0.49, "energy_usd": 0.01, "source": "device samples"}]
    bill = window_bill({"tco": {"allocation": {"lines": lines, "bills": bills}}})
    assert bill.usd == pytest.approx(0.50) and bill.parts["usd"].sum() == pytest.approx(bill.usd)
    assert list(bill.parts["part"]) == ["arm spec-ngram", "arm control", "idle"] and bill.estimate
    assert window_bill({"tco": {"allocation": None}}) is None
    chart = charts.bill_stack(bill.parts).to_dict()
    assert chart["encoding"]["x"]["stack"] == "zero" and chart["encoding"]["color"]["field"] == "part"
