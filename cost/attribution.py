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

The integrals are running totals over the merged event times (V(t) = integral of dt / n,
W(t) = integral of n dt, U(t) = integral of P dt), computed with numpy over whole instances:
a request costs O(log n), so a month of a busy fleet attributes in seconds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from specwatch.cost.sharing import in_flight, running_virtual


@dataclass(frozen=True)
class Spans:
    """Requests as the sweep sees them, one array entry each."""

    instance: np.ndarray  # str
    start: np.ndarray  # epoch s when the engine took it (after its queue)
    end: np.ndarray  # epoch s of its last token (>= start)
    device_s: np.ndarray  # as recorded; NaN: derive by processor sharing

    @classmethod
    def of(cls, rows: list[tuple[str, float, float, float | None]]) -> Spans:
        """From (instance, start, end, device_s or None) tuples."""
        instance, start, end, device = zip(*rows) if rows else ((), (), (), ())
        start_s = np.asarray(start, dtype=float)
        return cls(
            np.asarray(instance, dtype=object),
            start_s,
            np.maximum(np.asarray(end, dtype=float), start_s),
            np.array([np.nan if d is None else d for d in device], dtype=float),
        )


@dataclass(frozen=True)
class PowerSample:
    instance: str
    at: float  # epoch s; power_w is the mean since the instance's previous sample
    power_w: float | None
    source: str | None = None  # nvml | rapl | estimate


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


@dataclass(frozen=True)
class Attribution:
    """Per span (same order as the input): device time, whether it was derived, concurrency, energy
    (NaN: no power reading covers the request); per instance its up, busy and idle time."""

    device_s: np.ndarray
    derived: np.ndarray  # bool
    concurrency: np.ndarray
    energy_j: np.ndarray
    instances: list[Instance]


def attribute(spans: Spans, samples: list[PowerSample]) -> Attribution:
    n = len(spans.start)
    device, concurrency, energy = np.array(spans.device_s), np.ones(n), np.full(n, np.nan)
    instances = []
    names = sorted(set(spans.instance.tolist()) | {s.instance for s in samples})
    for name in names:
        rows = np.flatnonzero(spans.instance == name)
        curve = _PowerCurve(sorted((s for s in samples if s.instance == name), key=lambda s: s.at))
        device[rows], concurrency[rows], energy[rows] = _sweep(spans.start[rows], spans.end[rows], device[rows], curve)
        instances.append(_instance(name, device[rows], energy[rows], curve))
    return Attribution(device, np.isnan(spans.device_s), concurrency, energy, instances)


class _PowerCurve:
    """Step function of power: a sample at `at` holds from the previous sample to `at`."""

    def __init__(self, samples: list[PowerSample]) -> None:
        self.times = np.array([s.at for s in samples], dtype=float)
        readings = [s for s in samples if s.power_w is not None]
        self.ends = np.array([s.at for s in readings], dtype=float)
        self.watts = np.array([s.power_w for s in readings], dtype=float)
        self.first_start = math.inf  # where the first reading's interval starts (its length: the next one's)
        if len(self.ends):
            self.first_start = self.ends[0] - (self.ends[1] - self.ends[0] if len(self.ends) > 1 else 0.0)

    @property
    def up_s(self) -> float | None:
        if len(self.times) < 2:
            return None
        return float(self.times[-1] - self.times[0] + self.times[1] - self.times[0])

    def power_at(self, t: np.ndarray) -> np.ndarray:
        """Power of the reading that covers each t (NaN outside the readings)."""
        i = np.searchsorted(self.ends, t, side="left")
        inside = (i < len(self.ends)) & (t >= self.first_start)
        return np.where(inside, self.watts[np.minimum(i, max(len(self.ends) - 1, 0))] if len(self.ends) else 0, np.nan)

    @property
    def energy_j(self) -> float | None:
        if len(self.ends) < 2:
            return None
        intervals = np.diff(self.ends, prepend=self.first_start)
        return float(np.sum(self.watts * intervals))


def _sweep(start: np.ndarray, end: np.ndarray, recorded: np.ndarray, curve: _PowerCurve):
    """(device_s, concurrency, energy_j) of one instance's spans from running integrals (module docstring)."""
    times = np.unique(np.concatenate([start, end, curve.ends]))
    if len(times) == 0:
        return recorded, np.ones(0), np.full(0, np.nan)
    live = end > start
    dt, n = np.diff(times), in_flight(times, start, end)[:-1]
    virtual = running_virtual(times, n)
    weighted = np.concatenate([[0.0], np.cumsum(dt * n)])
    watts = np.nan_to_num(curve.power_at(times[1:]))
    joules = np.concatenate([[0.0], np.cumsum(watts * dt)])
    at_start, at_end = np.searchsorted(times, start), np.searchsorted(times, end)
    life = end - start
    device = np.where(np.isnan(recorded), virtual[at_end] - virtual[at_start], recorded)
    with np.errstate(invalid="ignore", divide="ignore"):
        concurrency = np.where(live, (weighted[at_end] - weighted[at_start]) / np.where(live, life, 1.0), 1.0)
        rate = np.minimum(np.where(live, device / np.where(live, life, 1.0), 0.0), 1.0)
    covered = live & ~np.isnan(curve.power_at(start + life / 2)) if len(curve.ends) else np.zeros(len(start), bool)
    energy = np.where(covered, (joules[at_end] - joules[at_start]) * rate, np.nan)
    return np.nan_to_num(device), np.maximum(concurrency, 1.0), energy


def _instance(name: str, device: np.ndarray, energy: np.ndarray, curve: _PowerCurve) -> Instance:
    total = curve.energy_j
    used = float(np.nansum(energy))
    idle = None if total is None else max(total - used, 0.0)
    return Instance(name, curve.up_s, float(device.sum()), total, idle)


def levels(concurrency: np.ndarray) -> np.ndarray:
    """Concurrency levels 1, 2, 4, 8, ...: the power of two nearest the mean in flight (log scale:
    a closed loop of 4 clients whose requests overlap 3.4-5.6 at a time is level 4)."""
    exponent = np.round(np.log2(np.maximum(concurrency, 1.0))).astype(int)
    return np.left_shift(1, np.maximum(exponent, 0))


def level_fractions(spans: Spans) -> tuple[np.ndarray, np.ndarray]:
    """(levels, fractions): the concurrency levels seen and, per span, the fraction of its life spent at
    each (rows sum to 1). The level of a moment is the power of two nearest the number of requests then
    in flight on the span's instance; a zero-length span takes the level at its start."""
    n = len(spans.start)
    per_instance = []
    for name in sorted(set(spans.instance.tolist())):
        rows = np.flatnonzero(spans.instance == name)
        per_instance.append((rows, *_level_time(spans.start[rows], spans.end[rows])))
    seen = sorted({int(level) for _, found, _ in per_instance for level in found})
    fractions = np.zeros((n, len(seen)))
    for rows, found, share in per_instance:
        for j, level in enumerate(found):
            fractions[rows, seen.index(int(level))] = share[:, j]
    return np.asarray(seen, dtype=int), fractions


def _level_time(start: np.ndarray, end: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """One instance: its levels and each span's fraction of life at each (running time integrals per level)."""
    times = np.unique(np.concatenate([start, end]))
    live = end > start
    in_flight = np.searchsorted(np.sort(start[live]), times, "right") - np.searchsorted(
        np.sort(end[live]), times, "right"
    )
    at = levels(np.maximum(in_flight, 1).astype(float))
    found = np.unique(at)
    dt = np.diff(times)
    at_start, at_end = np.searchsorted(times, start), np.searchsorted(times, end)
    life = np.where(live, end - start, 1.0)
    share = np.zeros((len(start), len(found)))
    for j, level in enumerate(found):
        running = np.concatenate([[0.0], np.cumsum(np.where(at[:-1] == level, dt, 0.0))])
        share[:, j] = np.where(live, (running[at_end] - running[at_start]) / life, at[at_start] == level)
    return found, share
