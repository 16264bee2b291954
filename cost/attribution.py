"""Who used the device, and when it sat idle: device time, concurrency and energy per request.

One sweep over an instance's requests (in flight from `started_at + queue_s` to
`started_at + e2e_s`) and its device samples:

    device_s     the request's own (engine: its share of each batched forward's token rows;
                 gateway: processor sharing); a record without one gets processor sharing
                 derived here: 1/n of every interval during which n requests were in flight
    concurrency  mean number of requests in flight during the request's life
                 = integral of n over its life / its length
    energy_j     the instance's energy over the request's life (power of the sample that
                 covers each moment x time) x the request's device rate (device_s / life):
                 a mode that draws more power while it runs is charged more per second,
                 and what nobody used is the idle energy
    idle         up-time (first to last device sample, one interval before the first)
                 minus the device time of the requests in it

Both integrals use running totals over the merged event times (virtual time:
V(t) = integral of dt / n, W(t) = integral of n dt, U(t) = integral of P dt), so each request costs
O(log n), not O(overlapping requests).
"""

from __future__ import annotations

import bisect
import math
from collections import defaultdict
from dataclasses import dataclass


@dataclass(frozen=True)
class Span:
    """One request as the sweep sees it."""

    instance: str
    start: float  # epoch s when the engine took it (after its queue)
    end: float  # epoch s of its last token
    device_s: float | None  # as recorded (None: derive by processor sharing)


@dataclass(frozen=True)
class PowerSample:
    instance: str
    at: float  # epoch s; power_w is the mean since the instance's previous sample
    power_w: float | None
    source: str | None = None  # nvml | rapl | estimate


@dataclass(frozen=True)
class Attributed:
    device_s: float
    derived: bool  # device_s derived here by processor sharing (the record had none)
    concurrency: float
    energy_j: float | None  # None: no power reading covers the request's life


@dataclass(frozen=True)
class Instance:
    """One instance's time in the window: up (sampled), busy (requests' device time), idle."""

    name: str
    up_s: float | None  # None: no device samples, up-time unknown
    busy_s: float
    energy_j: float | None  # all the energy its samples report
    idle_energy_j: float | None

    @property
    def idle_s(self) -> float | None:
        return None if self.up_s is None else max(self.up_s - self.busy_s, 0.0)


def attribute(spans: list[Span], samples: list[PowerSample]) -> tuple[list[Attributed], list[Instance]]:
    """Per span (same order) its device time, concurrency and energy; per instance its up and idle time."""
    by_instance: dict[str, list[int]] = defaultdict(list)
    for index, span in enumerate(spans):
        by_instance[span.instance].append(index)
    power: dict[str, list[PowerSample]] = defaultdict(list)
    for sample in samples:
        power[sample.instance].append(sample)
    out: list[Attributed | None] = [None] * len(spans)
    instances = []
    for name in sorted(set(by_instance) | set(power)):
        indices = by_instance.get(name, [])
        curve = _PowerCurve(sorted(power.get(name, []), key=lambda s: s.at))
        for index, attributed in zip(indices, _sweep([spans[i] for i in indices], curve)):
            out[index] = attributed
        instances.append(_instance(name, [out[i] for i in indices], curve))
    return out, instances  # type: ignore[return-value]


class _PowerCurve:
    """Step function of power: a sample at `at` holds from the previous sample to `at`."""

    def __init__(self, samples: list[PowerSample]) -> None:
        readings = [s for s in samples if s.power_w is not None]
        self.times = [s.at for s in samples]
        self.readings = readings
        self.ends = [s.at for s in readings]

    @property
    def up_s(self) -> float | None:
        if len(self.times) < 2:
            return None
        first_interval = self.times[1] - self.times[0]
        return self.times[-1] - self.times[0] + first_interval

    def power_at(self, t: float) -> float | None:
        """Power of the reading that covers t (None outside the readings)."""
        i = bisect.bisect_left(self.ends, t)
        if i == len(self.ends) or (i == 0 and t < self.ends[0] - self._first_interval()):
            return None
        return self.readings[i].power_w

    def _first_interval(self) -> float:
        return self.ends[1] - self.ends[0] if len(self.ends) > 1 else 0.0

    def cuts(self) -> list[float]:
        return self.ends

    @property
    def energy_j(self) -> float | None:
        if len(self.readings) < 2:
            return None
        total = self.readings[0].power_w * self._first_interval()
        for before, after in zip(self.readings, self.readings[1:]):
            total += after.power_w * (after.at - before.at)
        return total


def _sweep(spans: list[Span], curve: _PowerCurve) -> list[Attributed]:
    """Running integrals over one instance's merged event times (module docstring)."""
    times = sorted({t for s in spans for t in (s.start, s.end)} | set(curve.cuts()))
    delta: dict[float, int] = defaultdict(int)
    for span in spans:
        if span.end > span.start:
            delta[span.start] += 1
            delta[span.end] -= 1
    virtual, weighted, energy = {}, {}, {}
    v = w = u = 0.0
    active, previous = 0, None
    for t in times:
        if previous is not None and t > previous:
            dt = t - previous
            if active:
                v += dt / active
                w += dt * active
            u += (curve.power_at(t) or 0.0) * dt
        virtual[t], weighted[t], energy[t] = v, w, u
        active += delta.get(t, 0)
        previous = t
    return [_attributed(span, virtual, weighted, energy, curve) for span in spans]


def _attributed(span: Span, virtual, weighted, energy, curve: _PowerCurve) -> Attributed:
    life = span.end - span.start
    if life <= 0:
        return Attributed(span.device_s or 0.0, span.device_s is None, 1.0, None)
    shared = virtual[span.end] - virtual[span.start]
    device_s = span.device_s if span.device_s is not None else shared
    concurrency = (weighted[span.end] - weighted[span.start]) / life
    covered = curve.readings and curve.power_at(span.start + life / 2) is not None
    joules = (energy[span.end] - energy[span.start]) * min(device_s / life, 1.0) if covered else None
    return Attributed(device_s, span.device_s is None, max(concurrency, 1.0), joules)


def _instance(name: str, attributed: list[Attributed], curve: _PowerCurve) -> Instance:
    busy = sum(a.device_s for a in attributed)
    total = curve.energy_j
    used = sum(a.energy_j for a in attributed if a.energy_j is not None)
    idle = None if total is None else max(total - used, 0.0)
    return Instance(name, curve.up_s, busy, total, idle)


def level(concurrency: float) -> int:
    """Concurrency levels 1, 2, 4, 8, ...: the power of two nearest the mean in flight (log scale:
    a closed loop of 4 clients whose requests overlap 3.4-5.6 at a time is level 4)."""
    return 1 << max(0, round(math.log2(max(concurrency, 1.0))))
