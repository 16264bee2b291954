"""Per-request anomaly flags (alerts.anomalies), table-driven: (acceptance, output tokens, per-position
counts) -> expected flags, against a series of requests around 0.6."""

from __future__ import annotations

import pytest

from alerts.anomalies import flag
from alerts.detector_settings import AnomalySettings
from collector.detector_reads import DraftedRequest

SETTINGS = AnomalySettings(min_drafted_tokens=16, min_series_requests=50)


def request(i: int, accepted: int, drafted: int = 40, output: int = 64, per_position=(4, 3, 2, 1)) -> DraftedRequest:
    return DraftedRequest(
        i, f"r{i}", 0.0, "gpu-0", "m", "ngram", {}, "ok", drafted, accepted, 10, output, tuple(per_position)
    )


def series() -> list[DraftedRequest]:
    """60 requests with acceptance 0.55..0.65 (median 0.6, MAD 0.025)."""
    return [request(i, 22 + i % 5) for i in range(60)]


@pytest.mark.parametrize(
    ("probe", "expected"),
    [
        (request(100, 24), []),  # 0.6: typical
        (request(100, 4), ["outlier"]),  # 0.1: far below, but not ~0
        (request(100, 0), ["outlier", "collapse"]),  # 0.0 on a drafter whose median is 0.6
        (request(100, 40, output=256, per_position=(10, 10, 10, 10)), ["outlier", "repetition"]),
        (request(100, 40, output=32, per_position=(10, 10, 10, 10)), ["outlier"]),  # too short for a loop
        (request(100, 40, output=256, per_position=(10, 8, 5, 2)), ["outlier"]),  # accepted, but not flat
        (request(100, 2, drafted=8), []),  # drafted too few tokens to judge
    ],
)
def test_flags(probe, expected):
    found = flag({("s",): [*series(), probe]}, {probe.request_id}, SETTINGS)
    assert [f.flag for f in found] == expected
    assert all(f.expected == pytest.approx(0.6) for f in found)


def test_no_collapse_on_a_drafter_that_never_worked():
    bad = [request(i, i % 2) for i in range(60)]  # an untrained early exit: ~0.01
    probe = request(100, 0)
    assert flag({("s",): [*bad, probe]}, {probe.request_id}, SETTINGS) == []


def test_small_series_only_get_absolute_flags():
    probe = request(100, 0)
    assert flag({("s",): [*series()[:10], probe]}, {probe.request_id}, SETTINGS) == []
