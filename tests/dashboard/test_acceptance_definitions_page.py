"""The Acceptance page under Streamlit's AppTest, over a real collector holding records drafted at k = 2 and
k = 8 with the same first-position acceptance, one instance configured for lossy verification: the page shows
conditional acceptance (position 0) beside the mean, acceptance length / (k + 1) per k, names the definition
each threshold uses, and says why the lossy instance's acceptance is not what it seems."""

from __future__ import annotations

import time

import httpx
from collector_payloads import event_dict, request_dict
from test_dashboard_pages import dashboard_over, open_page

AT_2 = dict(gamma=2, num_drafts=10, num_draft_tokens=20, num_accepted_tokens=14, accepted_per_position=[8, 6])
AT_8 = dict(
    gamma=8, num_drafts=10, num_draft_tokens=80, num_accepted_tokens=30, accepted_per_position=[8, 6, 5, 4, 3, 2, 1, 1]
)
FLY = {"speculative_config": {"method": "ngram", "rejection_sample_method": "fly"}}


def test_acceptance_page_shows_each_definition_and_why_a_record_is_flagged(collector, monkeypatch):
    now = time.time()
    records = [request_dict(i, instance="fly_*1", started_at=now - 60 + i, **AT_2) for i in range(3)]
    records += [request_dict(10 + i, instance="gpu-8", started_at=now - 60 + i, **AT_8) for i in range(3)]
    events = [event_dict(0, instance="fly_*1", kind="config", at=now - 120, detail=FLY)]
    sent = httpx.post(f"{collector}/v1/ingest", json={"requests": records, "events": events}, timeout=30)
    assert sent.status_code == 200, sent.text

    page = open_page(dashboard_over(collector, monkeypatch), "views/acceptance.py")
    shown = {m.label: m.value for m in page.metric}
    assert shown["Conditional acceptance (position 0)"] == "0.800"  # 48 of 60 drafts, at both k
    assert shown["Acceptance rate (mean)"] == f"{132 / 300:.3f}"
    assert shown["Acceptance length / (k + 1)"] == "per k, below"  # two k: no one ratio
    (by_k,) = [df.value for df in page.dataframe if "k (gamma)" in df.value]
    rows = by_k.set_index("k (gamma)")
    assert list(rows["conditional acceptance (position 0)"]) == [0.8, 0.8]
    assert rows.loc[2, "acceptance length / (k + 1)"] == (1 + 14 / 10) / 3
    assert rows.loc[8, "acceptance rate (mean)"] < rows.loc[2, "acceptance rate (mean)"]

    (rules,) = [df.value for df in page.dataframe if "definition" in df.value]
    definition = dict(zip(rules["rule"], rules["definition"]))
    assert definition["SpecAcceptanceLow"].startswith("acceptance rate (the mean")

    (warning,) = [w.value for w in page.warning]
    assert warning.startswith("**fly\\_\\*1** is configured with `rejection_sample_method: fly` (lossy)"), warning
    assert "skip it" in warning
