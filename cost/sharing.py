"""Processor sharing per upstream across gateways (issue 25 item 7).

A gateway sees only its own requests at an upstream, so it charges each 1/n of every interval with
n counted among them (gateway.upstreams.ProcessorSharing). Two gateways in front of one upstream
then each charge as if they had it alone, and the upstream's time is billed up to twice. When more
than one gateway reported an upstream (gateway records, tagged `gateway=<name>`, whose lives overlap
the window), the device time of its gateway records is derived again over all of them:

    device_s(r) = integral over r's life of dt / n(t),  n(t) = gateway records in flight at the upstream

so the shares add up to the time at least one of them was in flight: the upstream's busy time. It is
marked `gateway_ps_merged` (derived: "~"). With one gateway its records keep their own figures.
One sweep per upstream over the sorted start and end times (running integral V(t) = integral of
dt / n): O(n log n), a request costs two binary searches.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import numpy as np

MERGED_SOURCE = "gateway_ps_merged"
DERIVED_SOURCES = ("derived", MERGED_SOURCE)  # device time the cost model derived from request times ("~")


def derived_in(sources: str | None) -> bool:
    """Whether an arm's device time sources (comma-joined, `cost.measured`) include a derived one."""
    return bool(sources) and any(s in DERIVED_SOURCES for s in sources.split(","))


@dataclass(frozen=True)
class Lives:
    """Gateway records as the sweep sees them (who was in flight where), one array entry each."""

    instance: np.ndarray  # str: the upstream
    gateway: np.ndarray  # str: the gateway that reported it ("" or None: one whose records carry no tag)
    start: np.ndarray  # epoch s
    end: np.ndarray  # epoch s, >= start


def shared_upstreams(lives: Lives) -> list[str]:
    """The upstreams more than one gateway reported."""
    pairs = set(zip(lives.instance.tolist(), (g or "" for g in lives.gateway.tolist())))
    counts = Counter(instance for instance, _ in pairs)
    return sorted(instance for instance, n in counts.items() if n > 1)


def merged_device_s(lives: Lives, instance: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """Per span (instance, start, end): the integral over [start, end] of dt / n(t), n(t) the records of
    `lives` in flight at its upstream; NaN where the upstream is not shared (module docstring)."""
    found = np.full(len(start), np.nan)
    for name in shared_upstreams(lives):
        rows, mine = np.flatnonzero(instance == name), lives.instance == name
        found[rows] = virtual_time(lives.start[mine], lives.end[mine], start[rows], end[rows])
    return found


def virtual_time(busy_start: np.ndarray, busy_end: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """V(end) - V(start) per span, V(t) = integral of dt / n over the time n > 0 busy intervals overlap."""
    times = np.unique(np.concatenate([busy_start, busy_end, start, end]))
    virtual = running_virtual(times, in_flight(times, busy_start, busy_end)[:-1])
    return virtual[np.searchsorted(times, end)] - virtual[np.searchsorted(times, start)]


def in_flight(times: np.ndarray, start: np.ndarray, end: np.ndarray) -> np.ndarray:
    """How many spans (start < end; empty ones left out) are in flight at each of the sorted `times`."""
    live = end > start
    return np.searchsorted(np.sort(start[live]), times, "right") - np.searchsorted(np.sort(end[live]), times, "right")


def running_virtual(times: np.ndarray, n: np.ndarray) -> np.ndarray:
    """V at each of `times`: the integral of dt / n over the intervals with n > 0 (n[i]: in flight during
    [times[i], times[i + 1]))."""
    return np.concatenate([[0.0], np.cumsum(np.where(n > 0, np.diff(times) / np.maximum(n, 1), 0.0))])
