"""Acceptance under each definition, for the Acceptance page (no streamlit here): the collector's
`GET /v1/acceptance/definitions` (the mean, conditional acceptance at position 0 and acceptance length /
(k + 1), overall and per k; the instances whose acceptance is lossy or forced) and, from `GET /v1/rules`,
which definition each acceptance threshold applies to (docs/glossary.md). And the slices of each drafter's
traffic that lost acceptance against the window before, with their retrain candidates
(`GET /v1/acceptance/slices`)."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from specwatch.dashboard.api import View, get
from specwatch.dashboard.formats import as_markdown_text, p_value

BY_K = {
    "k": "k (gamma)",
    "requests": "requests",
    "drafts": "drafts",
    "acceptance_rate": "acceptance rate (mean)",
    "conditional_acceptance": "conditional acceptance (position 0)",
    "mean_acceptance_length": "mean acceptance length",
    "acceptance_length_ratio": "acceptance length / (k + 1)",
}


@dataclass(frozen=True)
class Definitions:
    overall: dict = field(default_factory=dict)  # the `overall` figures of the endpoint
    by_k: pd.DataFrame = field(default_factory=pd.DataFrame)
    flagged: tuple[str, ...] = ()  # one Markdown line per lossy or forced instance: which, why
    rules: pd.DataFrame = field(default_factory=pd.DataFrame)  # each acceptance rule and its definition
    sampled: str | None = None  # "N of M requests" where a large window was sampled

    @property
    def ks(self) -> str:
        """The k of the window's drafting records, for a caption ("2, 8")."""
        return ", ".join(str(k) for k in self.by_k.get(BY_K["k"], []))


def definitions(view: View) -> Definitions:
    found = get("/v1/acceptance/definitions", view.params())
    by_k = pd.DataFrame([{label: row[key] for key, label in BY_K.items()} for row in found["by_k"]])
    sampled = found.get("sampled")
    return Definitions(
        found["overall"],
        by_k,
        tuple(_flag_line(flag) for flag in found["flagged"]),
        acceptance_rules(),
        f"{sampled['rows']:,} of {sampled['of']:,} requests" if sampled else None,
    )


def acceptance_rules() -> pd.DataFrame:
    """The collector's rules over an acceptance signal, with the definition each threshold applies to."""
    rows = [
        {"rule": r["name"], "fires when": f"{r['signal']} {r['op']} {r['threshold']:g}", "definition": r["definition"]}
        for r in get("/v1/rules")["rules"]
        if r.get("definition")
    ]
    return pd.DataFrame(rows, columns=["rule", "fires when", "definition"])


def _flag_line(flag: dict) -> str:
    return (
        f"**{as_markdown_text(flag['instance'])}** is configured with "
        f"`{flag['setting'].replace('`', chr(39))}` ({flag['mode']}): {flag['why']}. Its records are in the figures "
        "on this page; the acceptance alerts and the drift detector skip it."
    )


@dataclass(frozen=True)
class LostSlices:
    """The slices that lost acceptance, one table per drafter (its name as the key: producer text)."""

    by_drafter: dict[str, pd.DataFrame] = field(default_factory=dict)
    tested: int = 0
    untested: int = 0
    truncated: bool = False
    settings: dict = field(default_factory=dict)  # alpha, min_requests, min_captures
    sampled: str | None = None  # "N of M requests" where either window was sampled


def lost_slices(view: View) -> LostSlices:
    """The window against the window as long just before it (`GET /v1/acceptance/slices`)."""
    found = get("/v1/acceptance/slices", view.params())
    by_drafter: dict[str, list[dict]] = {}
    for row in found["slices"]:
        if row["lost"]:
            by_drafter.setdefault(row["drafter"], []).append(_slice_row(row, found["settings"]["min_captures"]))
    sampled = [s for s in (found["sampled_now"], found["sampled_before"]) if s]
    return LostSlices(
        {drafter: pd.DataFrame(rows) for drafter, rows in by_drafter.items()},
        found["tested"],
        found["untested"],
        found["truncated"],
        found["settings"],
        ", ".join(f"{s['rows']:,} of {s['of']:,} requests" for s in sampled) or None,
    )


def slice_name(row: dict) -> str:
    """tenant · scenario · prompt band, e.g. "acme · chat · 0–63 tokens" ("none": no such tag)."""
    low, high = row["prompt_tokens"]
    band = f"{low:,}+ tokens" if high is None else f"{low:,}–{high - 1:,} tokens"
    return f"{row['tenant'] or 'none'} · {row['scenario'] or 'none'} · {band}"


def _slice_row(row: dict, min_captures: int) -> dict:
    before, now = row["before"], row["now"]
    candidate = "yes" if row["retrain_candidate"] else f"no (needs {min_captures:,})"
    return {
        "slice (tenant · scenario · prompt)": slice_name(row),
        "model": row["model"],
        "acceptance before → now": f"{before['acceptance_rate']:.3f} → {now['acceptance_rate']:.3f}",
        "requests before → now": f"{before['requests']:,} → {now['requests']:,}",
        "p-value": p_value(row["p_value"]),
        "q-value": p_value(row["q_value"]),
        "retrain candidate": f"{candidate}: {row['captures']:,} captures",
        "export command": row["export_command"] if row["retrain_candidate"] else None,
    }
