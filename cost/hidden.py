"""Hidden monthly costs of speculation, and what the technical-debt reserve is a fraction of.

`cost.model` prices the arms; this module prices what no per-token figure shows (draft training,
monitoring storage, incidents, opportunity) and the reserve on what speculation adds.
"""

from __future__ import annotations

from dataclasses import dataclass

from specwatch.cost.terms import (
    SECONDS_PER_MONTH,
    WEEKS_PER_MONTH,
    CostInputs,
    HiddenCosts,
    ModeMeasure,
    Prices,
    needs_training,
)


@dataclass(frozen=True)
class HiddenMonthly:
    """Hidden monthly costs of speculation with one drafter (USD/month).

    The reserve (tech_debt_usd) is tech_debt_buffer x reserve_base_usd; with reserve_base "additions"
    that base is what speculation adds (the drafter's device time and memory, training, operations,
    storage), with "deployment" the speculative deployment's whole cost. The drafter's device time is
    already in the arm's serving cost and its memory in the instance's share: they are in the base,
    not added again."""

    draft_training_usd: float
    monitoring_usd: float
    monitoring_source: str
    incidents_usd: float
    incidents_source: str
    opportunity_usd: float
    tech_debt_usd: float
    total_usd: float
    draft_device_usd: float = 0.0  # the drafter's share of the arm's monthly device cost (draft_s / device_s)
    draft_memory_usd: float = 0.0  # the draft's memory share of the instances' month
    reserve_base: str = "additions"
    reserve_base_usd: float = 0.0


def draft_fraction(arm: ModeMeasure) -> float:
    """The share of the arm's device time spent drafting: draft_s / device_s (engine records), else
    draft_s / (draft_s + verify_s) when only the timings are known; 0 when not measured."""
    if arm.device_s > 0:
        return min(arm.draft_s / arm.device_s, 1.0)
    timed = arm.draft_s + arm.verify_s
    return arm.draft_s / timed if timed > 0 else 0.0


def draft_memory_monthly(arm: ModeMeasure, inputs: CostInputs) -> float:
    """The draft's memory share of every instance it held memory on, each at its own rate, for a month
    (one instance of the inputs' GPU when it ran on none)."""
    names = [i.name for i in inputs.usage if any(u.arm == arm.key for u in i.arms)] or [""]
    return sum(draft_memory_hourly(arm, inputs, name) for name in names) * SECONDS_PER_MONTH / 3600


def draft_memory_hourly(arm: ModeMeasure, inputs: CostInputs, instance: str) -> float:
    """$ per hour of the draft's memory on one instance: min(draft / its GPUs' memory, 1) x its rate."""
    device = inputs.device(instance)
    fraction = arm.draft_memory_bytes / ((device.gpu_count or 1) * inputs.memory_bytes_of(device))
    return min(fraction, 1.0) * device.usd_per_s * 3600


def hidden_monthly(
    hidden: HiddenCosts,
    prices: Prices,
    drafter: str | None,
    spec_monthly_usd: float,
    adds: float = 0.0,
    draft_device: float = 0.0,
    draft_memory: float = 0.0,
) -> HiddenMonthly:
    """USD/month:
    draft_training = draft_training_usd x (training_data_fraction / 0.10) / amortisation_months
                     (0 for an untrained drafter; the seed's run is at 10% of the target's data)
    monitoring     = monitoring_gb_per_day x retention_days x storage_usd_per_gb_month
                     (the steady-state store size, paid every month)
    incidents      = incident_days_per_week x 52/12 x engineer_day_usd
    opportunity    = opportunity_days_per_month x engineer_day_usd
    tech_debt      = tech_debt_buffer x base: "additions" = the drafter's device time and memory
                     (draft_device, draft_memory) + all of the above; "deployment" = the speculative
                     arm's monthly serving cost + all of the above"""
    training = training_run_usd(hidden, drafter) / hidden.amortisation_months
    monitoring = hidden.monitoring_gb_per_day * hidden.monitoring_retention_days * prices.storage_usd_per_gb_month
    incidents = hidden.incident_days_per_week * WEEKS_PER_MONTH * prices.engineer_day_usd
    opportunity = hidden.opportunity_days_per_month * prices.engineer_day_usd
    others = training + monitoring + incidents + opportunity
    base = others + (draft_device + draft_memory if hidden.reserve_base == "additions" else spec_monthly_usd)
    buffer = hidden.tech_debt_buffer * base
    return HiddenMonthly(
        training,
        monitoring,
        hidden.monitoring_source,
        incidents,
        hidden.source("incident_days_per_week"),
        opportunity,
        buffer,
        others + buffer,
        draft_device,
        draft_memory,
        hidden.reserve_base,
        base,
    )


def training_run_usd(hidden: HiddenCosts, drafter: str | None) -> float:
    """One training run of the drafter (0 when it has no trained weights)."""
    return hidden.draft_training_usd * hidden.training_data_fraction / 0.10 if needs_training(drafter) else 0.0
