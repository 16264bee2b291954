"""Per-request anomaly flags (alerts.anomalies), table-driven: (acceptance, output tokens, per-position
counts) -> expected flags, against a series of requests around 0.6."""

from __future__ import annotations

import pytest

from specwatch.alerts.anomalies import MarkerBaseline, flag, marker_baseline, new_drafter_collapse
from specwatch.alerts.detector_settings import AnomalySettings
from specwatch.collector.reads.detector_reads import DraftedRequest

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


MARKER = 1000.0  # a config marker; the baseline is the hour before it, judged for the hour after


def at(i: int, t: float, accepted: int, drafter: str = "ngram", drafted: int = 40) -> DraftedRequest:
    return DraftedRequest(i, f"r{i}", t, "gpu-0", "m", drafter, {}, "ok", drafted, accepted, 10, 64, (4, 3, 2, 1))


def baseline(*drafters: str, accepted: int = 36, n: int = 40) -> MarkerBaseline:
    """`n` requests before the marker, served by `drafters` in turn (acceptance accepted/40)."""
    before = [at(i, MARKER - 100 + i, accepted, drafters[i % len(drafters)]) for i in range(n)]
    return marker_baseline(MARKER, 3600.0, before)


@pytest.mark.parametrize(
    ("base", "probe", "flagged"),
    [
        (baseline("ngram"), at(100, MARKER + 5, 0, "early-exit:4"), True),  # the switch: a new drafter at ~0
        (baseline("ngram"), at(100, MARKER + 5, 2, "early-exit:4"), True),  # 0.05: still ~0
        (baseline("ngram"), at(100, MARKER + 5, 4, "early-exit:4"), False),  # 0.1: low, not a collapse
        (baseline("ngram"), at(100, MARKER + 5, 0, "ngram"), False),  # the same drafter: its own series judges
        (baseline("ngram", "early-exit:4"), at(100, MARKER + 5, 0, "early-exit:4"), False),  # served side by side
        (baseline("ngram"), at(100, MARKER - 5, 0, "early-exit:4"), False),  # before the marker
        (baseline("ngram"), at(100, MARKER + 3600, 0, "early-exit:4"), False),  # past the judged hour
        (baseline("ngram", accepted=4), at(100, MARKER + 5, 0, "early-exit:4"), False),  # baseline never worked
        (baseline("ngram", n=20), at(100, MARKER + 5, 0, "early-exit:4"), False),  # baseline too small
        (baseline("ngram"), at(100, MARKER + 5, 0, "early-exit:4", drafted=8), False),  # drafted too few
    ],
)
def test_collapse_of_a_drafter_new_at_the_marker(base, probe, flagged):
    found = new_drafter_collapse(probe, base, AnomalySettings(baseline_min_requests=30))
    assert (found is not None) == flagged
    if flagged:
        assert found.flag == "collapse" and found.expected == pytest.approx(0.9)
        assert found.detail["baseline_drafters"] == ["ngram"] and found.detail["marker_at"] == MARKER


def test_two_drafters_side_by_side_flag_nothing_after_a_marker():
    """An `auto` policy serving a good and a useless drafter together: a marker (say a version bump) passes,
    both keep being served, and neither collapses against the mixed baseline."""
    base = baseline("ngram", "early-exit:4", "ngram")
    after = [at(100 + i, MARKER + i, 0 if i % 2 else 36, ("ngram", "early-exit:4")[i % 2]) for i in range(40)]
    assert [new_drafter_collapse(r, base, SETTINGS) for r in after] == [None] * 40
