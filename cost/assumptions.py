"""Every input the cost model read, with its value and where it came from: the assumptions table.

Sources: "measured" (the store), "price table <date>", "given" (a file or an override),
"config", "observed" (volume over the window), "default (seed)" (the issue's seed figures,
never measured), "estimate" (derived, not metered: e.g. CPU power from CPU-seconds).
"""

from __future__ import annotations

from specwatch.cost.fleet import DEDICATED
from specwatch.cost.instances import GIVEN
from specwatch.cost.sharing import derived_in
from specwatch.cost.terms import (
    GB,
    HIDDEN_FIELDS,
    HIDDEN_UNITS,
    SEED,
    Assumption,
    CostInputs,
    monthly_volume,
    needs_training,
)


def assumptions(inputs: CostInputs) -> tuple[Assumption, ...]:
    return (
        *_prices(inputs),
        *_devices(inputs),
        *_volume(inputs),
        *_retries(inputs),
        *_arms(inputs),
        *_idle(inputs),
        *_shares(inputs),
        *_hidden(inputs),
    )


def _devices(inputs: CostInputs) -> list[Assumption]:
    """Each instance's own device and price, where it has one of its own (a fleet file, its samples)."""
    rows = []
    for named in inputs.devices:
        if named.source == GIVEN and not named.dedicated:
            continue  # priced as the inputs' GPU: the price rows above
        d = inputs.device(named.instance)
        what = f"{d.gpu_count} x {d.gpu_type} {d.pricing}" + (", dedicated" if d.dedicated else "")
        rows.append(Assumption(f"{d.instance} device ({what})", d.gpu_hour_usd or 0.0, "USD / GPU-hour", d.source))
    return rows


def _prices(inputs: CostInputs) -> list[Assumption]:
    gpu = inputs.prices.accelerator(inputs.gpu_type)
    table = f"price table {inputs.prices.as_of}" if inputs.prices.as_of else "price table"
    price_source = "given" if gpu.source == "given" else table
    return [
        Assumption("pricing", inputs.pricing, "on-demand | spot | reserved | on-prem", "config"),
        Assumption(f"{inputs.gpu_type} {inputs.pricing} price", inputs.gpu_hour_usd, "USD / GPU-hour", price_source),
        Assumption("GPUs per instance", inputs.gpu_count, "GPUs", "config"),
        Assumption(
            "device memory", inputs.device_memory_bytes / GB, "GB", "given" if inputs.gpu_memory_bytes else table
        ),
        Assumption("electricity", inputs.prices.electricity_usd_per_kwh, "USD / kWh", table),
        Assumption("PUE", inputs.prices.pue, "facility / IT energy", table),
        Assumption("energy in the price", "no" if inputs.energy_added else "yes", "", "config (pricing)"),
        Assumption("storage", inputs.prices.storage_usd_per_gb_month, "USD / GB-month", table),
        Assumption("engineer day", inputs.prices.engineer_day_usd, "USD / person-day", table),
    ]


def _retries(inputs: CostInputs) -> list[Assumption]:
    """How the retried requests' failed attempts were priced: measured by their producer, or assumed."""
    measured, assumed = inputs.retry_split
    rows = []
    if measured:
        rows.append(Assumption("retried requests, failed attempts' device time", measured, "requests", "measured"))
    if assumed:
        what = "retried requests, failed attempts' device time taken as k/(k+1) of the request's"
        rows.append(Assumption(what, assumed, "requests", "estimate"))
    return rows


def _volume(inputs: CostInputs) -> list[Assumption]:
    volume, source = monthly_volume(inputs)
    return [Assumption("monthly output tokens", volume, "tokens / month", source)]


def _arms(inputs: CostInputs) -> list[Assumption]:
    rows = []
    for arm in inputs.arms:
        device = "given" if arm.device_s_source == "given" else f"measured ({arm.device_s_source})"
        rows.append(Assumption(f"{arm.key} tokens per device-second", arm.tokens_per_s, "tokens / s", device))
        if arm.energy_j_per_token is not None:
            energy = "estimate" if "estimate" in (arm.energy_source or "") else f"measured ({arm.energy_source})"
            rows.append(Assumption(f"{arm.key} energy", arm.energy_j_per_token, "J / token", energy))
        else:
            rows.append(Assumption(f"{arm.key} energy", "not measured", "J / token", "unmeasured"))
        memory = (arm.target_memory_bytes or 0.0) + arm.draft_memory_bytes
        if arm.target_memory_bytes is None:
            rows.append(Assumption(f"{arm.key} memory", "whole device", "GB", arm.memory_source))
        else:
            rows.append(Assumption(f"{arm.key} memory", memory / GB, "GB", arm.memory_source))
    return rows


def _idle(inputs: CostInputs) -> list[Assumption]:
    if inputs.idle is None:
        return [Assumption("idle device time", "not measured", "s", "unmeasured (no device samples)")]
    return [
        Assumption("instance up-time", inputs.idle.up_s, "s", "measured (device samples)"),
        Assumption("idle device time", inputs.idle.idle_s, "s", "measured (up-time - Σ device_s)"),
        Assumption("idle allocation", inputs.idle_allocation, "separate | by_share", "config"),
    ]


def _shares(inputs: CostInputs) -> list[Assumption]:
    """Each instance's share m of its devices: the rest of its bill is the "other tenants" line (say so, as
    a laptop or a vLLM server reserving part of a GPU shows a large one; a fleet file's `dedicated` makes m 1)."""
    return [
        Assumption(f"{i.name} share of its device (m)", i.share, "the rest is the other tenants' line", i.share_source)
        for i in inputs.instances
        if i.share < 1.0 or i.share_source == DEDICATED
    ]


def _hidden(inputs: CostInputs) -> list[Assumption]:
    hidden = inputs.hidden
    return [Assumption(name, getattr(hidden, name), HIDDEN_UNITS[name], hidden.source(name)) for name in HIDDEN_FIELDS]


def estimated_from(inputs: CostInputs, key: str) -> tuple[str, ...]:
    """Inputs behind arm `key`'s net benefit that are estimates or seed defaults (see `Benefit`)."""
    found = []
    arms = [arm for arm in inputs.arms if arm.key == key or arm.mode == "autoregressive"]
    for arm in arms:
        if inputs.energy_added and arm.energy_source and "estimate" in arm.energy_source:
            found.append(f"{arm.key} energy (estimate)")
        if arm.memory_source not in ("measured", "given"):
            found.append(f"{arm.key} memory ({arm.memory_source})")
        if derived_in(arm.device_s_source):
            found.append(f"{arm.key} device time (processor sharing derived from request times)")
    spec = next((arm for arm in arms if arm.key == key), None)
    for name in HIDDEN_FIELDS:
        if name in ("draft_training_usd", "training_data_fraction", "amortisation_months") and not (
            spec and needs_training(spec.drafter)
        ):
            continue
        if inputs.hidden.source(name) == SEED and (name != "opportunity_days_per_month"):
            found.append(f"{name} (seed default)")
    return tuple(found)


def notes(inputs: CostInputs) -> tuple[str, ...]:
    """What the figures leave out or estimate, in words."""
    found = []
    if inputs.baseline is None:
        found.append("no autoregressive arm measured: no benefit of speculation can be computed")
    if not inputs.energy_added:
        found.append(f"{inputs.pricing} pricing: the GPU-hour price includes power; energy is shown, not added")
    for arm in inputs.arms:
        if arm.energy_source is None or arm.energy_j_per_token is None:
            found.append(f"{arm.key}: energy not measured" + (", counted as $0" if inputs.energy_added else ""))
        elif "estimate" in arm.energy_source:
            found.append(f"{arm.key}: energy is an estimate (CPU-seconds x watts per busy core, not metered)")
        if arm.memory_source not in ("measured", "given"):
            found.append(
                f"{arm.key}: memory {arm.memory_source}"
                + (" (whole devices charged)" if arm.target_memory_bytes is None else "")
            )
        if derived_in(arm.device_s_source):
            found.append(f"{arm.key}: device time derived by processor sharing over request times (no device_s)")
    if inputs.idle is None:
        found.append("idle time not measured (no device samples): only busy device time is priced")
    guessed = [d.instance for d in inputs.devices if d.estimate]
    if guessed:
        found.append(
            f"{', '.join(guessed)} priced as {inputs.gpu_type}: no device sample or fleet entry names its GPU"
            " (an estimate)"
        )
    if inputs.hidden.monitoring_source == SEED:
        found.append(
            f"monitoring storage: {inputs.hidden.monitoring_gb_per_day:g} GB/day assumed (seed default), not measured"
        )
    if inputs.hidden.opportunity_days_per_month == 0:
        found.append("opportunity cost (iteration slowdown, learning curve) not counted: 0 engineer-days assumed")
    return tuple(found)
