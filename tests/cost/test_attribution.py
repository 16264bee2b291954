"""Device time, concurrency, energy and idle time from request spans and power samples, by hand."""

from __future__ import annotations

import numpy as np
import pytest

from specwatch.cost.attribution import PowerSample, Spans, attribute, levels


def spans(*lives: tuple[float, float], device_s=None, instance="a") -> Spans:
    return Spans.of([(instance, start, end, device_s) for start, end in lives])


def test_processor_sharing_gives_each_request_its_share_of_every_interval():
    # A alone 0-2 s, A and B 2-6 s, B alone 6-7 s
    got = attribute(spans((0, 6), (2, 7)), [])
    assert got.device_s.tolist() == pytest.approx([4.0, 3.0])
    assert got.derived.tolist() == [True, True]
    assert got.concurrency.tolist() == pytest.approx([(2 * 1 + 4 * 2) / 6, (4 * 2 + 1 * 1) / 5])


def test_four_requests_sharing_ten_seconds_are_charged_two_and_a_half_each():
    got = attribute(spans(*[(0, 10)] * 4), [])
    assert got.device_s.tolist() == pytest.approx([2.5] * 4)
    assert got.concurrency.tolist() == pytest.approx([4.0] * 4)
    (instance,) = got.instances
    assert instance.busy_s == pytest.approx(10.0) and instance.up_s is None


def test_recorded_device_time_is_kept_and_energy_follows_it():
    # samples every 5 s at 100 W (0-5 s) then 300 W (5-10 s); a request 0-10 s that used the device 4 s
    samples = [PowerSample("a", t, w) for t, w in ((5, 100.0), (10, 300.0), (15, 100.0))]
    got = attribute(spans((0, 10), device_s=4.0), samples)
    assert got.device_s.tolist() == [4.0] and got.derived.tolist() == [False]
    assert got.energy_j[0] == pytest.approx((100 * 5 + 300 * 5) * 0.4)
    (instance,) = got.instances
    assert instance.up_s == pytest.approx(15.0)  # first sample covers 0-5 s
    assert instance.idle_s == pytest.approx(11.0)
    assert instance.energy_j == pytest.approx(100 * 5 + 300 * 5 + 100 * 5)
    assert instance.idle_energy_j == pytest.approx(2500 - 800)


def test_instances_are_swept_separately_and_order_is_kept():
    mixed = Spans.of([("b", 0, 4, None), ("a", 0, 4, None), ("b", 0, 4, None)])
    got = attribute(mixed, [])
    assert got.device_s.tolist() == pytest.approx([2.0, 4.0, 2.0])
    assert [i.name for i in got.instances] == ["a", "b"]


def test_no_power_reading_over_a_request_means_no_energy():
    samples = [PowerSample("a", 100.0, 50.0), PowerSample("a", 105.0, 50.0)]
    assert np.isnan(attribute(spans((0, 10)), samples).energy_j[0])


def test_a_zero_length_request_keeps_what_it_recorded():
    got = attribute(Spans.of([("a", 5, 5, 0.2), ("a", 5, 5, None), ("a", 0, 10, None)]), [])
    assert got.device_s.tolist() == pytest.approx([0.2, 0.0, 10.0])


def test_matches_a_slow_sweep_on_random_overlaps():
    """The vectorised integrals against a direct sum over 1 ms steps."""
    rng = np.random.default_rng(7)
    start = rng.uniform(0, 5, 40)
    end = start + rng.uniform(0.01, 2, 40)
    got = attribute(Spans.of([("a", s, e, None) for s, e in zip(start, end)]), [])
    step = 1e-3
    grid = np.arange(0, 8, step) + step / 2
    active = (grid[:, None] >= start) & (grid[:, None] < end)
    n = active.sum(axis=1)
    share = np.where(n > 0, 1 / np.maximum(n, 1), 0)[:, None] * active * step
    assert got.device_s == pytest.approx(share.sum(axis=0), abs=0.01)
    assert got.device_s.sum() == pytest.approx(step * (n > 0).sum(), abs=0.01)


@pytest.mark.parametrize(("mean", "expected"), [(1.0, 1), (1.4, 1), (1.6, 2), (3.4, 4), (5.6, 4), (6.0, 8), (0.5, 1)])
def test_levels_are_the_nearest_power_of_two(mean, expected):
    assert levels(np.array([mean])).tolist() == [expected]
