"""What the store says each instance did over a window: up-time, the deployment's share, each arm's use,
and step timings per concurrency level; and what each instance runs on (`Device`). `cost.allocation`
splits each instance's bill from these."""

from __future__ import annotations

from dataclasses import dataclass, replace

# Where an instance's price came from (Device.source): its entry in a fleet file, the device its samples
# name, the GPU the caller gave for every instance (--gpu, a what-if file), or the inputs' GPU type for
# an instance nothing names (an estimate).
FLEET, SAMPLED, GIVEN, ESTIMATE = "fleet file", "device samples", "given", "estimate (no device sample names its GPU)"


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
    """One instance over the window: up-time, the deployment's share of it, and each arm's use.

    A view narrower than the instance (a tenant, a tag, a model, a drafter) has `outside_s`: the device
    time of the instance's requests outside the view. Idle time is then shared by device time (OpenCost's
    rule): the view's part is busy / (busy + outside), so the views of all tenants plus the requests of no
    tenant add up to the instance's bill."""

    name: str
    up_s: float | None  # sampled up-time (None: no device samples)
    arms: tuple[ArmUse, ...]
    share: float = 1.0  # the deployment's share of the device (memory held / the device's), <= 1
    share_source: str = "whole device"
    energy_j: float | None = None  # every joule its samples report (None: no power readings)
    outside_s: float | None = None  # device time of requests outside the view; None: the view is everything
    outside_energy_j: float = 0.0  # their energy (what requests outside the view used)

    @property
    def busy_s(self) -> float:
        return sum(use.device_s + use.failed_device_s for use in self.arms)

    @property
    def billed_s(self) -> float:
        """Up-time; the busy time when up-time is unknown or shorter (requests then show none idle)."""
        return max(self.up_s or 0.0, self.busy_s + (self.outside_s or 0.0))

    @property
    def idle_s(self) -> float:
        return self.billed_s - self.busy_s - (self.outside_s or 0.0)

    @property
    def view_part(self) -> float:
        """The view's part of the idle time: all of it for the whole workload, else by device time."""
        if self.outside_s is None:
            return 1.0
        worked = self.busy_s + self.outside_s
        return self.busy_s / worked if worked > 0 else 0.0

    @property
    def used_energy_j(self) -> float:
        return sum((use.energy_j or 0.0) + (use.failed_energy_j or 0.0) for use in self.arms)

    @property
    def total_energy_j(self) -> float | None:
        known = self.energy_j is not None or any(u.energy_j is not None for u in self.arms)
        used = self.used_energy_j + self.outside_energy_j
        return max(self.energy_j or 0.0, used) if known else None

    @property
    def idle_energy_j(self) -> float | None:
        total = self.total_energy_j
        return None if total is None else total - self.used_energy_j - self.outside_energy_j


@dataclass(frozen=True)
class Device:
    """What one instance runs on and how it is paid for. gpu_count / pricing None: the inputs' figure;
    gpu_hour_usd None: the price table's for its GPU type and pricing (`priced` fills all three)."""

    instance: str
    gpu_type: str
    gpu_count: int | None = None
    pricing: str | None = None  # on-demand | spot | reserved | on-prem
    gpu_hour_usd: float | None = None
    dedicated: bool = False  # declared whole to the deployment (fleet file): share 1, no other tenants
    commitment: str | None = None  # the reserved commitment it is billed under (FOCUS CommitmentDiscountId)
    source: str = GIVEN  # FLEET | SAMPLED | GIVEN | ESTIMATE

    def priced(self, prices, gpu_count: int, pricing: str) -> Device:
        """This device with the inputs' count and pricing where it names none, and its $/GPU-hour."""
        pricing = self.pricing or pricing
        usd = self.gpu_hour_usd
        usd = prices.accelerator(self.gpu_type).price(pricing) if usd is None else usd
        return replace(self, gpu_count=self.gpu_count or gpu_count, pricing=pricing, gpu_hour_usd=usd)

    @property
    def usd_per_s(self) -> float:
        """gpu_count x $/GPU-hour / 3600 (of a priced device)."""
        return (self.gpu_count or 1) * (self.gpu_hour_usd or 0.0) / 3600

    @property
    def energy_added(self) -> bool:
        """On-prem pays for power itself; a cloud GPU-hour price already includes it."""
        return self.pricing == "on-prem"

    @property
    def estimate(self) -> bool:
        return self.source == ESTIMATE
