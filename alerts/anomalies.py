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
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from alerts.detector_settings import AnomalySettings
from collector.detector_reads import DraftedRequest

MAD_SCALE = 1.4826  # MAD -> stddev for a normal distribution


@dataclass(frozen=True)
class Flag:
    request: DraftedRequest
    flag: str
    expected: float  # the series' median acceptance
    detail: dict


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
