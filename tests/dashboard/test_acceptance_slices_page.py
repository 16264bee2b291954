"""The Acceptance page's "Slices that lost acceptance" under Streamlit's AppTest, over a real collector: one
drafter's acme/chat short-prompt slice falls from ~0.8 to ~0.3 between the previous hour and this one while
another slice holds, and the fallen slice has 16 chat captures. The page names that slice only, with the
collector's figures, its p-value as the other pages print one, and the export command; producer strings
(a drafter name with Markdown in it) show as text."""

from __future__ import annotations

import time

import httpx
import numpy as np
from collector_payloads import request_dict
from test_dashboard_pages import dashboard_over, open_page

from specwatch.dashboard.formats import p_value

DRAFTER = "model:*draft*_[x](y)"  # Markdown a page must not render
ACME = {"tenant": "acme", "scenario": "chat"}


def drafted(i: int, rate: float, at: float, prompt: int, tags: dict) -> dict:
    accepted = int(round(float(np.clip(rate, 0, 1)) * 16))
    per_position = [min(4, max(0, accepted - 4 * p)) for p in range(4)]
    return request_dict(
        i,
        drafter=DRAFTER,
        started_at=at,
        prompt_tokens=prompt,
        num_accepted_tokens=accepted,
        accepted_per_position=per_position,
        tags=tags,
    )


def records(now: float) -> list[dict]:
    rng, found = np.random.default_rng(3), []
    for hour, acme in ((now - 7000, 0.8), (now - 3500, 0.3)):
        for j in range(25):
            found.append(drafted(len(found), rng.normal(acme, 0.08), hour + 100 * j, 30, ACME))
            found.append(drafted(len(found), rng.normal(0.6, 0.08), hour + 100 * j, 300, {"tenant": "globex"}))
    return found


def captures(now: float) -> list[dict]:
    return [
        {
            "capture_id": f"cap-{i}",
            "instance": "gpu-0",
            "model": "smollm2-135m",
            "drafter": DRAFTER,
            "kind": "chat",
            "tags": ACME,
            "started_at": now - 60,
            "prompt": [{"role": "user", "content": f"question {i}"}],
            "output": f"answer {i}",
            "prompt_tokens": 30,
            "output_tokens": 5,
            "num_draft_tokens": 16,
            "num_accepted_tokens": 4,
            "expires_at": now + 3600,
        }
        for i in range(16)
    ]


def test_the_page_names_the_slice_that_lost_acceptance_and_its_retrain_candidate(collector, monkeypatch):
    now = time.time()
    for path, body in (("/v1/ingest", {"requests": records(now)}), ("/v1/captures", {"captures": captures(now)})):
        sent = httpx.post(f"{collector}{path}", json=body, timeout=30)
        assert sent.status_code == 200, sent.text
    stored = httpx.get(f"{collector}/v1/acceptance/slices", params={"last": 3600}, timeout=30).json()
    (fallen,) = [s for s in stored["slices"] if s["lost"]]

    page = open_page(dashboard_over(collector, monkeypatch), "views/acceptance.py")
    assert "Slices that lost acceptance" in [h.value for h in page.subheader]
    assert f"**{DRAFTER}**" not in [m.value for m in page.markdown]  # the name escaped, shown as itself
    assert any(m.value.startswith("**model:\\*draft\\*\\_\\[x\\]\\(y\\)**") for m in page.markdown)
    (table,) = [df.value for df in page.dataframe if "slice (tenant · scenario · prompt)" in df.value]
    (row,) = table.to_dict("records")
    before, after = fallen["before"]["acceptance_rate"], fallen["now"]["acceptance_rate"]
    assert row["slice (tenant · scenario · prompt)"] == "acme · chat · 0–63 tokens"
    assert row["acceptance before → now"] == f"{before:.3f} → {after:.3f}" and after < before
    assert row["requests before → now"] == "25 → 25"
    assert row["p-value"] == p_value(fallen["p_value"]) and row["q-value"] == p_value(fallen["q_value"])
    assert row["retrain candidate"] == "yes: 16 captures"
    assert "--tenant acme --scenario chat --prompt-tokens 0-63" in row["export command"]
    assert "Mann-Whitney" in " ".join(c.value for c in page.caption)
