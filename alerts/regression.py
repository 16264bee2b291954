"""Regression at a deploy marker: did acceptance drop when an instance's configuration changed?

A marker is a `config` engine event (the engine's version, model and drafter at start or on a
change; a gateway's record of an upstream's /version). For each instance's latest marker in
`lookback`, per model: the per-request acceptance of the requests that started in the `side`
before the marker against those after it (up to `side`), with a one-sided Mann-Whitney U test
(after < before). The value is the relative drop of the pooled acceptance (accepted / drafted
tokens: 0.2 = 20% lower after), significant when p < `alpha` with `min_requests` on each side.
Each pass replaces every regression row; the `acceptance_regression` signal reads them.
"""

from __future__ import annotations

from collections import defaultdict
from datetime import UTC, datetime

import numpy as np
from sqlalchemy import Engine

from specwatch.alerts.detector_settings import RegressionSettings
from specwatch.alerts.detector_store import SeriesRow, save_rows
from specwatch.collector.db import write_transaction
from specwatch.collector.reads.detector_reads import DraftedRequest, Marker, config_markers, instance_drafted
from specwatch.collector.reads.queries import Window

KIND = "regression"
_SHOWN = ("version", "model", "model_hash", "drafter", "default_drafter", "speculative_config", "role")


def marker_name(marker: Marker) -> str:
    return datetime.fromtimestamp(marker.at, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def describe(marker: Marker, previous: Marker | None) -> str:
    """What the marker says changed (from the previous marker of its instance), else what it holds."""
    detail, before = marker.detail, previous.detail if previous else {}
    changed = [f"{k}: {before[k]} → {detail[k]}" for k in sorted(detail) if k in before and before[k] != detail[k]]
    if changed:
        return "; ".join(str(c)[:200] for c in changed[:6])
    shown = [f"{k}={detail[k]}" for k in _SHOWN if k in detail]
    return ", ".join(shown) or "config event"


def pooled(requests: list[DraftedRequest]) -> float:
    return sum(r.accepted for r in requests) / sum(r.drafted for r in requests)


def compare(marker: Marker, previous: Marker | None, before, after, settings: RegressionSettings) -> SeriesRow:
    """One model's before/after comparison at the marker."""
    from scipy.stats import mannwhitneyu

    x_before = np.array([r.acceptance for r in before])
    x_after = np.array([r.acceptance for r in after])
    n = min(len(before), len(after))
    p = float(mannwhitneyu(x_after, x_before, alternative="less").pvalue) if n >= 2 else 1.0
    rate_before, rate_after = pooled(before), pooled(after)
    drop = 1.0 - rate_after / rate_before if rate_before > 0 else 0.0
    labels = (("instance", marker.instance), ("marker", marker_name(marker)), ("model", after[0].model))
    annotations = {
        "marker": f"{marker_name(marker)} ({describe(marker, previous)})",
        "before": f"{rate_before:.3f}",
        "after": f"{rate_after:.3f}",
        "p_value": f"{p:.2g}",
        "n_before": str(len(before)),
        "n_after": str(len(after)),
        "drafters_before": ",".join(sorted({r.drafter or "none" for r in before})),
        "drafters_after": ",".join(sorted({r.drafter or "none" for r in after})),
    }
    significant = n >= settings.min_requests and p < settings.alpha
    state = {"marker_at": marker.at, "p_value": p, "before": rate_before, "after": rate_after}
    return SeriesRow(KIND, labels, drop, n, significant, annotations, state, marker.at)


def _by_model(requests) -> dict[str, list[DraftedRequest]]:
    found = defaultdict(list)
    for r in requests:
        found[r.model].append(r)
    return found


def compare_marker(db: Engine, marker: Marker, previous: Marker | None, settings, now: float) -> list[SeriesRow]:
    if now <= marker.at:
        return []
    at, side, floor = marker.at, settings.side, settings.min_drafted_tokens
    before = _by_model(instance_drafted(db, marker.instance, Window(at - side, at), floor))
    after = _by_model(instance_drafted(db, marker.instance, Window(at, min(now, at + side)), floor))
    return [compare(marker, previous, before[m], after[m], settings) for m in after if before.get(m)]


def latest_markers(db: Engine, settings: RegressionSettings, now: float) -> list[tuple[Marker, Marker | None]]:
    """Each instance's latest marker in the lookback, with the one before it (within 30 days) if any."""
    found: dict[str, list[Marker]] = defaultdict(list)
    for marker in config_markers(db, Window(now - settings.lookback - 30 * 86400, now)):
        found[marker.instance].append(marker)
    latest = [(ms[-1], ms[-2] if len(ms) > 1 else None) for ms in found.values()]
    return [(m, prev) for m, prev in latest if m.at >= now - settings.lookback]


def run_pass(db: Engine, settings: RegressionSettings, now: float) -> list[SeriesRow]:
    rows = [
        row
        for marker, prev in latest_markers(db, settings, now)
        for row in compare_marker(db, marker, prev, settings, now)
    ]
    with write_transaction(db) as conn:
        save_rows(conn, rows, replace_kind=KIND)
    return rows
