"""Device time, concurrency, energy and idle time from request spans and power samples, by hand."""

from __future__ import annotations

import pytest

from cost.attribution import PowerSample, Span, attribute, level


def spans(*lives: tuple[float, float], device_s=None, instance="a") -> list[Span]:
    return [Span(instance, start, end, device_s) for start, end in lives]


def test_processor_sharing_gives_each_request_its_share_of_every_interval():
    # A alone 0-2 s, A and B 2-6 s, B alone 6-7 s
    (a, b), _ = attribute(spans((0, 6), (2, 7)), [])
    assert (a.device_s, b.device_s) == (pytest.approx(4.0), pytest.approx(3.0))
    assert a.derived and b.derived
    assert a.concurrency == pytest.approx((2 * 1 + 4 * 2) / 6)
    assert b.concurrency == pytest.approx((4 * 2 + 1 * 1) / 5)


def test_four_requests_sharing_ten_seconds_are_charged_two_and_a_half_each():
    attributed, (instance,) = attribute(spans(*[(0, 10)] * 4), [])
    assert [a.device_s for a in attributed] == pytest.approx([2.5] * 4)
    assert [a.concurrency for a in attributed] == pytest.approx([4.0] * 4)
    assert instance.busy_s == pytest.approx(10.0) and instance.up_s is None


def test_recorded_device_time_is_kept_and_energy_follows_it():
    # samples every 5 s at 100 W (0-5 s) then 300 W (5-10 s); a request 0-10 s that used the device 4 s
    samples = [PowerSample("a", t, w) for t, w in ((5, 100.0), (10, 300.0), (15, 100.0))]
    (request,), (instance,) = attribute(spans((0, 10), device_s=4.0), samples)
    assert request.device_s == 4.0 and not request.derived
    assert request.energy_j == pytest.approx((100 * 5 + 300 * 5) * 0.4)
    assert instance.up_s == pytest.approx(15.0)  # first sample covers 0-5 s
    assert instance.idle_s == pytest.approx(11.0)
    assert instance.energy_j == pytest.approx(100 * 5 + 300 * 5 + 100 * 5)
    assert instance.idle_energy_j == pytest.approx(2500 - 800)


def test_instances_are_swept_separately_and_order_is_kept():
    mixed = [Span("b", 0, 4, None), Span("a", 0, 4, None), Span("b", 0, 4, None)]
    attributed, instances = attribute(mixed, [])
    assert [a.device_s for a in attributed] == pytest.approx([2.0, 4.0, 2.0])
    assert [i.name for i in instances] == ["a", "b"]


def test_no_power_reading_over_a_request_means_no_energy():
    samples = [PowerSample("a", 100.0, 50.0), PowerSample("a", 105.0, 50.0)]
    (request,), _ = attribute(spans((0, 10)), samples)
    assert request.energy_j is None


@pytest.mark.parametrize(("mean", "expected"), [(1.0, 1), (1.4, 1), (1.6, 2), (3.4, 4), (5.6, 4), (6.0, 8), (0.5, 1)])
def test_levels_are_the_nearest_power_of_two(mean, expected):
    assert level(mean) == expected
