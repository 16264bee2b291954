"""The Tuning page's reads: the collector's speculation tuner (`GET /v1/tune`) as tables and curves.
No Streamlit here (pages cache this through `dashboard.reads`)."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from specwatch.dashboard.api import View, get


@dataclass(frozen=True)
class Tuning:
    """The tuner's answer as it came (`found`), per-bucket rows, and tokens/s against k per bucket."""

    found: dict
    buckets: pd.DataFrame  # batch, today k, recommended k, predicted tokens/s of both, gain, why
    curves: pd.DataFrame  # batch, k, tokens/s, low, high (buckets with data)

    @property
    def stale(self) -> str | None:
        return self.found.get("stale_reason") if self.found.get("stale") else None


def _interval(bucket: dict, k: int) -> str:
    tps = bucket["tokens_per_s"]
    if k >= len(tps):
        return "—"
    low, high = bucket["low"], bucket["high"]
    return f"{tps[k]:.1f}" + (f" [{low[k]:.1f}, {high[k]:.1f}]" if k < len(low) else "")


def _row(bucket: dict) -> dict:
    return {
        "batch": f"{bucket['start']}–{bucket['end']}",
        "today k": bucket["today_k"],
        "recommended k": bucket["k"],
        "today tok/s": _interval(bucket, bucket["today_k"]),
        "recommended tok/s": _interval(bucket, bucket["k"]),
        "gain": None if bucket["gain"] is None else round(bucket["gain"], 3),
        "why": bucket["reason"],
    }


def _curve(bucket: dict) -> list[dict]:
    label, low, high = f"{bucket['start']}–{bucket['end']}", bucket["low"], bucket["high"]
    return [
        {"batch": label, "k": k, "tokens/s": tps, "low": low[k] if k < len(low) else None,
         "high": high[k] if k < len(high) else None, "today": k == bucket["today_k"], "recommended": k == bucket["k"]}
        for k, tps in enumerate(bucket["tokens_per_s"])
    ]  # fmt: skip


def tuning(view: View, max_batch: int = 256) -> Tuning:
    """`GET /v1/tune` over the view's window and filters."""
    found = get("/v1/tune", {**view.params(), "max_batch": max_batch})
    buckets = pd.DataFrame([_row(b) for b in found["buckets"]])
    curves = pd.DataFrame([point for b in found["buckets"] for point in _curve(b)])
    columns = ["batch", "k", "tokens/s", "low", "high", "today", "recommended"]
    return Tuning(found, buckets, curves if not curves.empty else pd.DataFrame(columns=columns))
