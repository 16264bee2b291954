"""The Cost page's day-by-day chart under Streamlit's AppTest, against a collector holding
speculative and plain requests on two UTC days: one line per arm, the days' figures as
GET /v1/cost/daily gives them, and the estimate marked."""

from __future__ import annotations

import json
import math
import time

import httpx
import pytest
from collector_payloads import plain_request_dict, request_dict
from streamlit.dataframe_util import convert_arrow_bytes_to_pandas_df
from test_dashboard_pages import dashboard_over, open_page

DAY_S = 86400
TIMED = {"device_s_source": "engine", "output_tokens": 64, "queue_s": 0.0}


def served(start: float, first: int, spec_device_s: float) -> list[dict]:
    spec = [request_dict(first + i, started_at=start + i, device_s=spec_device_s, **TIMED) for i in range(10)]
    plain = [plain_request_dict(first + 100 + i, started_at=start + i, device_s=1.0, **TIMED) for i in range(10)]
    return spec + plain


def daily_charts(page) -> list[tuple[dict, list]]:
    """(spec, rows of its data) of each Altair chart whose y is $ per 1M tokens per day."""
    found = []
    for chart in page.get("vega_lite_chart"):
        spec = json.loads(chart.proto.spec)
        if spec.get("encoding", {}).get("y", {}).get("field") == "usd_per_mtok":
            frames = [convert_arrow_bytes_to_pandas_df(d.data.data) for d in chart.proto.datasets]
            found.append((spec, [row for frame in frames for row in frame.to_dict("records")]))
    return found


def test_cost_page_draws_a_line_per_arm_per_day(collector, monkeypatch):
    now = time.time()
    today = math.floor(now / DAY_S) * DAY_S
    records = served(today - DAY_S + 3600, 0, spec_device_s=0.5) + served(max(today, now - 60), 1000, 0.8)
    assert httpx.post(f"{collector}/v1/ingest", json={"requests": records}, timeout=30).status_code == 200
    page = open_page(dashboard_over(collector, monkeypatch), "views/cost.py")
    ((spec, rows),) = daily_charts(page)
    assert spec["encoding"]["color"]["field"] == "arm" and spec["mark"]["type"] == "line"
    expected = httpx.get(f"{collector}/v1/cost/daily", params={"days": 30}, timeout=30).json()["rows"]
    assert len(expected) == 4  # two days, two arms
    drawn = {(r["day"], r["arm"]): r["usd_per_mtok"] for r in rows}
    assert drawn == pytest.approx({(r["day"], r["arm"]): r["usd_per_mtok"] for r in expected})
    captions = "\n".join(c.value for c in page.caption)
    assert "⚠️ estimate: speculative:ngram:" in captions and "on 2 of 2 days" in captions
