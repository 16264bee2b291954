"""The Tuning page under Streamlit's AppTest against a real collector: per bucket today's k, the
recommended k with predicted tokens/s and the gain, the curves, and the emitted configuration."""

from __future__ import annotations

import time

import httpx
from test_dashboard_pages import dashboard_over, open_page
from tuning_payloads import records


def test_tuning_page_shows_the_schedule(collector, monkeypatch):
    sent = httpx.post(f"{collector}/v1/ingest", json={"requests": records(time.time() - 1500)}, timeout=30)
    assert sent.status_code == 200, sent.text
    page = open_page(dashboard_over(collector, monkeypatch), "views/tuning.py")
    (buckets,) = [df.value for df in page.dataframe]
    rows = {row["batch"]: row for row in buckets.to_dict("records")}
    assert (rows["1–1"]["today k"], rows["1–1"]["recommended k"]) == (4, 4)
    assert rows["6–11"]["recommended k"] == 0 and float(rows["6–11"]["gain"]) > 1
    assert rows["6–11"]["recommended tok/s"].startswith("160.0")  # 8 requests / 0.05 s a plain step
    assert "not enough data" in rows["2–2"]["why"]
    assert {m.label: m.value for m in page.metric}["today's k"] == "4"
    code = [c.value for c in page.code]
    assert any('"num_speculative_tokens_per_batch_size": [[1, 5, 4], [6, 11, 0], [12, 256, 4]]' in c for c in code)
    assert any(c == "draft_len_schedule: {5: 4, 11: 0, 256: 4}" for c in code)


def test_tuning_page_without_data_says_so(collector, monkeypatch):
    page = open_page(dashboard_over(collector, monkeypatch), "views/tuning.py")
    assert any("No bucket has enough speculative requests" in i.value for i in page.info)
