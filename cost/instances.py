"""What the store says each instance did over a window: up-time, the deployment's share, each arm's use,
and step timings per concurrency level. `cost.allocation` splits each instance's bill from these."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ArmUse:
    """One arm's use of one instance over the window: ok work and failed work (retries)."""

    arm: str  # ModeMeasure.key
    device_s: float  # of its ok requests
    failed_device_s: float = 0.0  # of requests that did not finish ok, and failed attempts of retried ones
    output_tokens: int = 0  # ok output tokens
    energy_j: float | None = None  # of its ok requests (None: not measured)
    failed_energy_j: float | None = None
    derived: bool = False  # part of its device time derived from request times (an estimate: "~")


@dataclass(frozen=True)
class StepTime:
    """An arm's step timings at one concurrency level (the requests that spent most of their life there):
    the break-even's times come from one level, so both arms' forwards carry the same batch."""

    level: int
    arm: str
    target_forwards: int  # after prefill: output tokens - 1 - accepted drafts, summed
    verify_s: float
    drafts: int = 0
    draft_tokens: int = 0
    draft_s: float = 0.0

    @property
    def seconds_per_forward(self) -> float | None:
        return self.verify_s / self.target_forwards if self.target_forwards > 0 and self.verify_s > 0 else None


@dataclass(frozen=True)
class InstanceUse:
    """One instance over the window: up-time, the deployment's share of it, and each arm's use."""

    name: str
    up_s: float | None  # sampled up-time (None: no device samples)
    arms: tuple[ArmUse, ...]
    share: float = 1.0  # the deployment's share of the device (memory held / the device's), <= 1
    share_source: str = "whole device"
    energy_j: float | None = None  # every joule its samples report (None: no power readings)

    @property
    def busy_s(self) -> float:
        return sum(use.device_s + use.failed_device_s for use in self.arms)

    @property
    def billed_s(self) -> float:
        """Up-time; the busy time when up-time is unknown or shorter (requests then show none idle)."""
        return max(self.up_s or 0.0, self.busy_s)

    @property
    def idle_s(self) -> float:
        return self.billed_s - self.busy_s

    @property
    def used_energy_j(self) -> float:
        return sum((use.energy_j or 0.0) + (use.failed_energy_j or 0.0) for use in self.arms)

    @property
    def total_energy_j(self) -> float | None:
        known = self.energy_j is not None or any(u.energy_j is not None for u in self.arms)
        return max(self.energy_j or 0.0, self.used_energy_j) if known else None

    @property
    def idle_energy_j(self) -> float | None:
        total = self.total_energy_j
        return None if total is None else total - self.used_energy_j
