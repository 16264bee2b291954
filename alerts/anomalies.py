"""Per-request anomalies, flagged in the leader's pass (`alerts.runner`) into `request_flags`.

For each series (as `alerts.baselines` defines it) the pass takes the median and MAD of per-request
acceptance over the requests it reads together with the series' recent ones, and flags a request
that drafted at least `min_drafted_tokens`:

- `outlier`: |x - median| > `mad_k` * 1.4826 * MAD (a robust z-score), once the series has
  `min_series_requests` requests;
- `repetition`: x >= `repetition_acceptance` on an output of at least `repetition_min_output`
  tokens whose every draft position accepted almost always (the per-position counts stay flat:
  the last position accepts >= 90% as often as the first), the signature of a loop the n-gram
  drafter copies from its own output (no text is stored, only the counts);
- `collapse`: x <= `collapse_acceptance` where the series' median is >= `collapse_min_median`
  (a drafter that usually works suddenly accepts nothing).

A drafter switched in at a deploy marker starts a new series, whose own median knows nothing of what
the instance did before. So `collapse` is also judged against the instance and model's baseline in the
window before its latest `config` marker (`MarkerBaseline`): a request started after the marker (within
the window) with x <= `collapse_acceptance`, whose drafter the baseline never served, while the
baseline's median is >= `collapse_min_median` over >= `baseline_min_requests` requests. Drafters the
baseline already served (an `auto` policy or a bandit serving several side by side) are judged only in
their own series, so serving a weak drafter next to a good one flags nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from specwatch.alerts.detector_settings import AnomalySettings
from specwatch.collector.reads.detector_reads import DraftedRequest

MAD_SCALE = 1.4826  # MAD -> stddev for a normal distribution


@dataclass(frozen=True)
class Flag:
    request: DraftedRequest
    flag: str
    expected: float  # the series' median acceptance
    detail: dict


@dataclass(frozen=True)
class MarkerBaseline:
    """An instance and model's drafted requests in the window [start, marker_at) before its latest marker."""

    marker_at: float
    until: float  # the end of the window after the marker that is judged against this baseline
    drafters: frozenset[str | None]
    median: float
    n: int


def marker_baseline(marker_at: float, side: float, before: list[DraftedRequest]) -> MarkerBaseline | None:
    if not before:
        return None
    median = float(np.median([r.acceptance for r in before]))
    return MarkerBaseline(marker_at, marker_at + side, frozenset(r.drafter for r in before), median, len(before))


def new_drafter_collapse(r: DraftedRequest, base: MarkerBaseline, s: AnomalySettings) -> Flag | None:
    """`collapse` of a request whose drafter is new since the marker, against the instance's baseline."""
    if not (base.marker_at <= r.started_at < base.until) or r.drafter in base.drafters:
        return None
    if r.drafted < s.min_drafted_tokens or r.acceptance > s.collapse_acceptance:
        return None
    if base.n < s.baseline_min_requests or base.median < s.collapse_min_median:
        return None
    drafters = sorted(d or "none" for d in base.drafters)
    detail = {"baseline": "before marker", "baseline_median": round(base.median, 3), "baseline_drafters": drafters}
    return Flag(r, "collapse", base.median, detail | {"marker_at": base.marker_at, "n_baseline": base.n})


def flat_positions(per_position: tuple[int, ...]) -> bool:
    """Every draft position accepted nearly as often as the first (a repetitive tail)."""
    return len(per_position) > 1 and per_position[0] > 0 and per_position[-1] >= 0.9 * per_position[0]


def flags_of(r: DraftedRequest, median: float, mad: float, n: int, s: AnomalySettings) -> list[tuple[str, dict]]:
    """The flags one request earns against its series' median, MAD and size."""
    x, found = r.acceptance, []
    if n >= s.min_series_requests and abs(x - median) > s.mad_k * MAD_SCALE * max(mad, 1e-3):
        found.append(("outlier", {"robust_z": round((x - median) / (MAD_SCALE * max(mad, 1e-3)), 2)}))
    if (
        x >= s.repetition_acceptance
        and r.output_tokens >= s.repetition_min_output
        and flat_positions(r.accepted_per_position)
    ):
        found.append(("repetition", {"output_tokens": r.output_tokens, "per_position": list(r.accepted_per_position)}))
    if x <= s.collapse_acceptance and median >= s.collapse_min_median and n >= s.min_series_requests:
        found.append(("collapse", {"series_median": round(median, 3)}))
    return found


def flag(series: dict[tuple, list[DraftedRequest]], new: set[str], s: AnomalySettings) -> list[Flag]:
    """Flags for the requests whose ids are in `new`, each judged against its whole series list."""
    flags = []
    for requests in series.values():
        usable = [r for r in requests if r.drafted >= s.min_drafted_tokens]
        if not usable:
            continue
        xs = np.array([r.acceptance for r in usable])
        median = float(np.median(xs))
        mad = float(np.median(np.abs(xs - median)))
        for r in usable:
            if r.request_id in new:
                flags += [Flag(r, name, median, d) for name, d in flags_of(r, median, mad, len(usable), s)]
    return flags
