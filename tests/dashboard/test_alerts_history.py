"""The Alerts page's history tables (issue 55): what a person reads comes first (time, rule, state change,
instance), labels and details as `key=value` text, never a Python dict; ids, fingerprints and raw labels
are the internals the page keeps in an expander."""

from __future__ import annotations

import pandas as pd

from specwatch.dashboard import alerts_service
from specwatch.dashboard.api import View

AT = 1_796_510_164.808
HISTORY = {
    "transitions": [
        {"id": 7, "at": AT, "rule": "SpecAcceptanceLow", "fingerprint": "9f2c", "from_state": "pending",
         "to_state": "firing", "value": 0.04,
         "labels": {"alertname": "SpecAcceptanceLow", "instance": "laptop", "drafter": "early-exit:2"}},
    ],
    "actions": [
        {"id": 3, "at": AT, "rule": "TTFTP99High", "fingerprint": "51aa", "action": "fallback_autoregressive",
         "instance": "laptop", "outcome": "ok", "detail": {"to": "autoregressive", "status": 200}},
    ],
    "notifications": [
        {"id": 1, "key": "k1", "receiver": "slack", "rule": "SpecAcceptanceLow", "alert_status": "firing",
         "payload": {"text": "x"}, "created_at": AT, "status": "sent", "attempts": 1, "next_attempt_at": AT,
         "last_error": None, "delivered_at": AT + 1},
    ],
}  # fmt: skip


def history(monkeypatch) -> alerts_service.AlertHistory:
    monkeypatch.setattr(alerts_service, "get", lambda path, params: HISTORY)
    return alerts_service.alert_history(View())


def test_human_columns_come_first_and_read_as_text(monkeypatch):
    found = history(monkeypatch)
    shown = found.transitions.shown
    assert list(shown.columns[:4]) == ["time", "rule", "change", "instance"]
    assert shown.iloc[0]["change"] == "pending → firing" and shown.iloc[0]["labels"] == "drafter=early-exit:2"
    assert shown.iloc[0]["time"] == pd.Timestamp(AT, unit="s", tz="UTC")
    assert found.actions.shown.iloc[0]["detail"] == "to=autoregressive, status=200"
    assert list(found.notifications.shown.columns[:3]) == ["time", "rule", "alert"]


def test_internals_are_kept_apart(monkeypatch):
    found = history(monkeypatch)
    for part in (found.transitions, found.actions, found.notifications):
        assert not {"id", "fingerprint", "key", "at", "created_at", "payload"} & set(part.shown.columns)
        assert "id" in part.internals.columns and len(part.internals) == len(part.shown)
        text = part.shown.astype(str).to_string()
        assert "{'" not in text and str(int(AT)) not in text  # no dict repr, no epoch seconds
    assert found.transitions.internals.iloc[0]["fingerprint"] == "9f2c"


def test_an_empty_history_is_empty_tables(monkeypatch):
    monkeypatch.setattr(alerts_service, "get", lambda path, params: {k: [] for k in HISTORY})
    found = alerts_service.alert_history(View())
    assert found.transitions.shown.empty and found.notifications.internals.empty
