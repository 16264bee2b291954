"""The Alerts page's history (`GET /v1/alerts/history`) as an engineer reads it. No Streamlit here.

Each table comes in two parts: what a person reads first (time, rule, state change, instance, what
was done), and the internals that tell rows apart (ids, fingerprints, raw labels and payloads,
epoch seconds), which the page keeps in an expander. Labels and details show as `key=value` text.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import pandas as pd

from specwatch.dashboard.api import View, get


@dataclass(frozen=True)
class Part:
    """One history table: `shown` first, `internals` (same rows, same order) on request."""

    shown: pd.DataFrame
    internals: pd.DataFrame


@dataclass(frozen=True)
class AlertHistory:
    """The window's alert transitions, remediation actions and webhook deliveries, newest first."""

    transitions: Part
    actions: Part
    notifications: Part


def pairs(mapping: dict | None, leave_out: tuple[str, ...] = ()) -> str:
    """{"instance": "a", "n": 2} -> "instance=a, n=2" (nested values as compact JSON)."""
    shown = (f"{k}={v if isinstance(v, str) else json.dumps(v)}" for k, v in (mapping or {}).items())
    return ", ".join(item for item in shown if item.split("=", 1)[0] not in leave_out)


def _when(rows: list[dict], column: str) -> pd.Series:
    return pd.to_datetime([row[column] for row in rows], unit="s", utc=True)


def _transitions(rows: list[dict]) -> Part:
    shown = pd.DataFrame(
        {
            "time": _when(rows, "at"),
            "rule": [r["rule"] for r in rows],
            "change": [f"{r['from_state']} → {r['to_state']}" for r in rows],
            "instance": [(r["labels"] or {}).get("instance") for r in rows],
            "value": [r["value"] for r in rows],
            "labels": [pairs(r["labels"], ("alertname", "instance", "severity")) for r in rows],
        }
    )
    internals = pd.DataFrame({k: [r[k] for r in rows] for k in ("id", "fingerprint")})
    return Part(shown, internals.assign(labels=[json.dumps(r["labels"]) for r in rows]))


def _actions(rows: list[dict]) -> Part:
    shown = pd.DataFrame(
        {
            "time": _when(rows, "at"),
            "rule": [r["rule"] for r in rows],
            "action": [r["action"] for r in rows],
            "instance": [r["instance"] for r in rows],
            "outcome": [r["outcome"] for r in rows],
            "detail": [pairs(r["detail"]) for r in rows],
        }
    )
    internals = pd.DataFrame({k: [r[k] for r in rows] for k in ("id", "fingerprint")})
    return Part(shown, internals.assign(detail=[json.dumps(r["detail"]) for r in rows]))


def _notifications(rows: list[dict]) -> Part:
    shown = pd.DataFrame(
        {
            "time": _when(rows, "created_at"),
            "rule": [r["rule"] for r in rows],
            "alert": [r["alert_status"] for r in rows],
            "receiver": [r["receiver"] for r in rows],
            "delivery": [r["status"] for r in rows],
            "attempts": [r["attempts"] for r in rows],
            "delivered": [None if r["delivered_at"] is None else pd.Timestamp(r["delivered_at"], unit="s", tz="UTC")
                          for r in rows],
            "last error": [r["last_error"] for r in rows],
        }
    )  # fmt: skip
    internals = pd.DataFrame({k: [r[k] for r in rows] for k in ("id", "key")})
    return Part(shown, internals.assign(payload=[json.dumps(r["payload"])[:500] for r in rows]))


def alert_history(view: View) -> AlertHistory:
    found = get("/v1/alerts/history", view.params(with_filters=False))
    parts = {"transitions": _transitions, "actions": _actions, "notifications": _notifications}
    return AlertHistory(**{name: part(found[name]) for name, part in parts.items()})
