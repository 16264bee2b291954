"""Alert rules as a rules file writes them, for the alert tests."""

from __future__ import annotations

from typing import Any


def acceptance_rule(**changes: Any) -> dict[str, Any]:
    """`SpecAcceptanceLow` (accepted / drafted tokens < 0.6 over 5 min, for 1 min) with `changes` on top;
    `for` is a keyword: pass it as `**{"for": "0s"}`."""
    rule = {
        "name": "SpecAcceptanceLow",
        "signal": "acceptance_rate",
        "op": "<",
        "threshold": 0.6,
        "window": "5m",
        "for": "1m",
        "min_samples": 5,
        "group_by": ["instance"],
    }
    return rule | changes
