"""The one allocation rule: every instance's bill split into lines that add up to it, nothing left over.

Per instance, on its own device (`CostInputs.device`: its GPU type, count, pricing and $/GPU-hour),
over the window:

    rate            = its gpu_count x its $/GPU-hour / 3600                         [$ / instance-second]
    billed_s        = its up-time (device samples); the busy time when unsampled or when busy > up
    bill            = billed_s x rate  (+ on-prem: its energy kWh x PUE x $/kWh)   [$]
    share m         = the deployment's memory / the instance's (1: whole device, not measured, or
                      declared dedicated)

    other tenants   = (1 - m) x bill                  (only when the deployment uses part of the device)
    arm a           = m x rate x Σ device_s of a's ok requests
    retries of a    = m x rate x Σ device_s of a's failed work (requests not ok, and the failed
                      attempts of retried ones)
    idle            = m x rate x (billed_s - Σ device_s of every request) x the view's part
                      (1 for the whole workload; else its device time / every request's: OpenCost's rule)
    outside view    = m x rate x (device_s of requests outside the view + the rest of idle): a narrower
                      view's bill still adds up, and Σ over tenants + requests of no tenant = the bill
                      separate: its own line; weighted: split over the arms by their device time;
                      even: split equally over the arms the instance served (OpenCost's two choices)

On-prem, energy goes the same way: arm a gets m x the energy of its ok requests, its retries m x the
energy of its failed work, idle m x (the instance's energy - what requests used), other tenants
(1 - m) x all of it; each request's energy is counted once. Under cloud pricing the price already pays
for power: the lines carry their kWh for information and $0 of energy.

The fleet bill is Σ of the instances' bills, each at its own rate. Σ lines = Σ bills to floating-point
precision, whatever the split (`Allocation.residual_usd`). Every
figure that prices device time (the TCO table, the concurrency table, the report, the xlsx, the FOCUS
export) is these lines or a per-device-second rate taken from them.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

from specwatch.cost.terms import J_PER_KWH, CostInputs, Device, InstanceUse

KINDS = ("arm", "retries", "idle", "outside_view", "other_tenants")


@dataclass(frozen=True)
class Line:
    instance: str
    kind: str  # one of KINDS
    arm: str | None  # the arm charged; None: idle kept separate, or other tenants
    device_s: float  # instance-seconds the line stands for (before the share: other tenants, the billed time)
    output_tokens: int  # ok output tokens (arm lines)
    compute_usd: float
    energy_kwh: float | None  # the line's energy before the share (None: not measured)
    energy_usd: float  # added to the bill (on-prem), else 0
    estimate: bool = False  # rests on device time derived from request times

    @property
    def usd(self) -> float:
        return self.compute_usd + self.energy_usd


@dataclass(frozen=True)
class Bill:
    instance: str
    billed_s: float
    busy_s: float
    share: float
    share_source: str
    compute_usd: float  # billed_s x gpu_count x $/GPU-hour / 3600
    energy_kwh: float | None
    energy_usd: float  # added (on-prem), else 0
    gpu_type: str = ""  # the instance's own device and price
    gpu_count: int = 1
    pricing: str = "on-demand"
    gpu_hour_usd: float = 0.0
    source: str = ""  # where its price came from: fleet file | device samples | given | estimate (...)

    @property
    def usd(self) -> float:
        return self.compute_usd + self.energy_usd

    @property
    def gpu_hours(self) -> float:
        """Instance-hours billed (x gpu_count for GPU-hours)."""
        return self.billed_s / 3600

    @property
    def usd_per_s(self) -> float:
        """Its rate: gpu_count x $/GPU-hour / 3600 per instance-second."""
        return self.gpu_count * self.gpu_hour_usd / 3600

    @property
    def estimate(self) -> bool:
        """Priced as the inputs' GPU type: nothing named the instance's own."""
        return self.source.startswith("estimate")


@dataclass(frozen=True)
class Allocation:
    method: str  # separate | weighted | even
    lines: tuple[Line, ...]
    bills: tuple[Bill, ...]

    @property
    def bill_usd(self) -> float:
        return sum(b.usd for b in self.bills)

    @property
    def lines_usd(self) -> float:
        return sum(line.usd for line in self.lines)

    @property
    def residual_usd(self) -> float:
        """Σ bills - Σ lines: 0 to floating-point precision."""
        return self.bill_usd - self.lines_usd

    @property
    def allocated_usd(self) -> float:
        """What the view read is charged: its work, its retries and its part of idle (the bill less other
        tenants' memory and the requests outside the view)."""
        return sum(line.usd for line in self.lines if line.kind in ("arm", "retries", "idle"))

    def usd(self, arm: str | None = None, kind: str | None = None) -> float:
        """Σ of the lines charged to `arm` (None: any) of `kind` (None: any)."""
        return sum(
            line.usd for line in self.lines if (arm is None or line.arm == arm) and (kind is None or line.kind == kind)
        )

    def by_kind(self) -> dict[str, float]:
        """The bill by line kind (arm lines by arm key), for a stacked bar: arms, retries, idle, other tenants."""
        found: dict[str, float] = defaultdict(float)
        for line in self.lines:
            found[line.arm if line.kind == "arm" else line.kind] += line.usd
        return dict(found)


def allocate(inputs: CostInputs) -> Allocation:
    """The lines of every instance of `inputs`, each at its own device's rate (module docstring)."""
    kwh_usd = inputs.prices.pue * inputs.prices.electricity_usd_per_kwh
    lines, bills = [], []
    for instance in inputs.usage:
        device = inputs.device(instance.name)
        rate, usd_per_kwh = device.usd_per_s, kwh_usd if device.energy_added else 0.0
        bill = _bill(instance, device, usd_per_kwh)
        bills.append(bill)
        lines += _lines(instance, bill, rate, usd_per_kwh, inputs.idle_method)
    return Allocation(inputs.idle_method, tuple(lines), tuple(bills))


def _kwh(joules: float | None) -> float | None:
    return None if joules is None else joules / J_PER_KWH


def _bill(instance: InstanceUse, device: Device, usd_per_kwh: float) -> Bill:
    kwh = _kwh(instance.energy_j)
    return Bill(
        instance.name,
        instance.billed_s,
        instance.busy_s,
        instance.share,
        instance.share_source,
        instance.billed_s * device.usd_per_s,
        kwh,
        (kwh or 0.0) * usd_per_kwh,
        device.gpu_type,
        device.gpu_count or 1,
        device.pricing or "on-demand",
        device.gpu_hour_usd or 0.0,
        device.source,
    )


def _lines(instance: InstanceUse, bill: Bill, rate: float, usd_per_kwh: float, method: str) -> list[Line]:
    m, name = instance.share, instance.name

    def line(kind, arm, seconds, tokens, joules, estimate=False, part=1.0):
        kwh = None if joules is None else joules * part / J_PER_KWH
        return Line(
            name,
            kind,
            arm,
            seconds * part,
            tokens,
            m * rate * seconds * part,
            kwh,
            m * (kwh or 0.0) * usd_per_kwh,
            estimate,
        )

    found = []
    for use in instance.arms:
        found.append(line("arm", use.arm, use.device_s, use.output_tokens, use.energy_j, use.derived))
        if use.failed_device_s > 0 or (use.failed_energy_j or 0) > 0:
            found.append(line("retries", use.arm, use.failed_device_s, 0, use.failed_energy_j, use.derived))
    idle_s, idle_j, mine = instance.idle_s, instance.idle_energy_j, instance.view_part
    for arm, part in _idle_parts(instance, method) if (idle_s > 0 or (idle_j or 0.0) > 0) and mine > 0 else ():
        found.append(line("idle", arm, idle_s, 0, idle_j, part=part * mine))
    if instance.outside_s is not None and (instance.outside_s > 0 or mine < 1):
        outside_j = instance.outside_energy_j + (idle_j or 0.0) * (1 - mine) if idle_j is not None else None
        found.append(line("outside_view", None, instance.outside_s + idle_s * (1 - mine), 0, outside_j))
    if m < 1.0:
        rest = 1 - m
        found.append(
            Line(
                name,
                "other_tenants",
                None,
                bill.billed_s,
                0,
                rest * bill.compute_usd,
                bill.energy_kwh,
                rest * bill.energy_usd,
            )
        )
    return found


def _idle_parts(instance: InstanceUse, method: str) -> list[tuple[str | None, float]]:
    """(arm or None, fraction of the idle line): kept separate, by device time, or evenly."""
    arms = [use for use in instance.arms if use.device_s + use.failed_device_s > 0]
    busy = sum(use.device_s + use.failed_device_s for use in arms)
    if method == "separate" or not arms or busy <= 0:
        return [(None, 1.0)]
    if method == "even":
        return [(use.arm, 1.0 / len(arms)) for use in arms]
    return [(use.arm, (use.device_s + use.failed_device_s) / busy) for use in arms]
