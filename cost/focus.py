"""FinOps FOCUS export: the allocation's lines per UTC day, instance and arm, as FOCUS 1.2 rows.

Every line of the bill is a row (arms, their retries, idle, other tenants of the device), so
Σ BilledCost = Σ EffectiveCost = the instances' bills, day by day. Columns: FOCUS 1.2's (what
`focus-validator` bundles) and 1.3's `Allocated*` columns naming the allocation method (which lines
are shares of a shared instance, and how idle was spread). Tags carry mode, arm, drafter and line.
Each row is priced on its instance's own device (`CostInputs.device`): SkuId its GPU type, SkuPriceId
GPU type and pricing, ListUnitPrice its $/GPU-hour, ListCost = ListUnitPrice x PricingQuantity (the
GPU-hours the line stands for); BilledCost adds on-prem energy. Reserved rows name their commitment.

    focus_rows(db, window, prices, ...)   the rows (dicts) of the days the window covers
    write_focus(rows, path_or_stream)          CSV
"""

from __future__ import annotations

import csv
import io
import json
import math
import time
from collections.abc import Callable

from sqlalchemy import Engine

from specwatch.collector.reads.queries import Filters, Window
from specwatch.cost.allocation import Line, allocate
from specwatch.cost.terms import CostInputs, Device

DAY_S = 86400
PRICING_CATEGORY = {"on-demand": "Standard", "spot": "Dynamic", "reserved": "Committed", "on-prem": "Other"}
ALLOCATION_METHOD = {
    "separate": "idle its own line",
    "weighted": "idle shared by device time",
    "even": "idle shared evenly",
}
COLUMNS = [
    "AvailabilityZone",
    "BilledCost",
    "BillingAccountId",
    "BillingAccountName",
    "BillingAccountType",
    "BillingCurrency",
    "BillingPeriodEnd",
    "BillingPeriodStart",
    "CapacityReservationId",
    "CapacityReservationStatus",
    "ChargeCategory",
    "ChargeClass",
    "ChargeDescription",
    "ChargeFrequency",
    "ChargePeriodEnd",
    "ChargePeriodStart",
    "CommitmentDiscountCategory",
    "CommitmentDiscountId",
    "CommitmentDiscountName",
    "CommitmentDiscountQuantity",
    "CommitmentDiscountStatus",
    "CommitmentDiscountType",
    "CommitmentDiscountUnit",
    "ConsumedQuantity",
    "ConsumedUnit",
    "ContractedCost",
    "ContractedUnitPrice",
    "EffectiveCost",
    "InvoiceId",
    "InvoiceIssuerName",
    "ListCost",
    "ListUnitPrice",
    "PricingCategory",
    "PricingCurrency",
    "PricingCurrencyContractedUnitPrice",
    "PricingCurrencyEffectiveCost",
    "PricingCurrencyListUnitPrice",
    "PricingQuantity",
    "PricingUnit",
    "ProviderName",
    "PublisherName",
    "RegionId",
    "RegionName",
    "ResourceId",
    "ResourceName",
    "ResourceType",
    "ServiceCategory",
    "ServiceName",
    "ServiceSubcategory",
    "SkuId",
    "SkuMeter",
    "SkuPriceDetails",
    "SkuPriceId",
    "SubAccountId",
    "SubAccountName",
    "SubAccountType",
    "Tags",
    "AllocatedMethodId",
    "AllocatedMethodDetails",
    "AllocatedResourceId",
    "AllocatedResourceName",
    "AllocatedTags",
]


def _iso(epoch: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))


def _month(epoch: float) -> tuple[float, float]:
    t = time.gmtime(epoch)
    start = time.mktime((t.tm_year, t.tm_mon, 1, 0, 0, 0, 0, 0, 0)) - time.mktime(time.gmtime(0))
    year, month = (t.tm_year + 1, 1) if t.tm_mon == 12 else (t.tm_year, t.tm_mon + 1)
    end = time.mktime((year, month, 1, 0, 0, 0, 0, 0, 0)) - time.mktime(time.gmtime(0))
    return start, end


def day_windows(window: Window) -> list[Window]:
    """The UTC days the window covers, each clipped to it."""
    first = math.floor(window.start / DAY_S) * DAY_S
    days = range(int(first), int(math.ceil(window.end / DAY_S) * DAY_S), DAY_S)
    return [
        Window(max(d, window.start), min(d + DAY_S, window.end))
        for d in days
        if min(d + DAY_S, window.end) > max(d, window.start)
    ]


def focus_rows(
    db: Engine,
    window: Window,
    inputs_for: Callable[[Engine, Window], CostInputs],
) -> list[dict]:
    """FOCUS rows of every line of every UTC day of `window`; `inputs_for(db, day)` measures a day
    (the caller's prices, overrides and filters)."""
    rows = []
    for day in day_windows(window):
        inputs = inputs_for(db, day)
        rows += [focus_row(line, inputs, day) for line in allocate(inputs).lines]
    return rows


def focus_rows_of(inputs: CostInputs, window: Window) -> list[dict]:
    """The rows of one priced period (what-if inputs, or one day already measured)."""
    return [focus_row(line, inputs, window) for line in allocate(inputs).lines]


def measured_focus(
    db: Engine, window: Window, prices, *, gpu_type: str, overrides=None, hidden=None, filters: Filters = Filters()
) -> list[dict]:
    """FOCUS rows of the store's `window`, each UTC day measured and priced like `measured_summary`: each
    instance on its own device (fleet file, device samples; `gpu_type` where nothing names one), or every
    instance on `overrides.gpu_type` when given (--gpu)."""
    from specwatch.cost.inputs import Overrides, apply_overrides
    from specwatch.cost.measured import measured_inputs
    from specwatch.cost.terms import HiddenCosts

    edits = overrides or Overrides()
    devices = dict(gpu_type=edits.gpu_type or gpu_type, fleet=edits.fleet, per_instance=edits.gpu_type is None)

    def inputs_for(db: Engine, day: Window) -> CostInputs:
        found = measured_inputs(
            db, day, prices, hidden=hidden or HiddenCosts(), filters=filters, measure_storage=False, **devices
        )
        return apply_overrides(found, edits)

    return [_with_view(row, filters) for row in focus_rows(db, window, inputs_for)]


def _with_view(row: dict, filters: Filters) -> dict:
    """A view's rows carry its tags (`x_specwatch_tag_<key>`, e.g. the tenant) on its own lines; what lies
    outside it and other tenants' memory are tagged as not the view's."""
    if not filters.tags:
        return row
    tags = json.loads(row["Tags"])
    mine = tags["x_specwatch_line"] in ("arm", "retries", "idle")
    tags |= {f"x_specwatch_tag_{key}": value if mine else "(outside the view)" for key, value in filters.tags}
    return row | {"Tags": json.dumps(tags), "AllocatedTags": json.dumps(tags)}


def _tags(line: Line, inputs: CostInputs) -> dict[str, str]:
    mode, _, drafter = (line.arm or "").partition(":")
    tags = {"x_specwatch_line": line.kind}
    if line.arm:
        tags |= {"x_specwatch_mode": mode, "x_specwatch_arm": line.arm, "x_specwatch_drafter": drafter or "none"}
    return tags


def focus_row(line: Line, inputs: CostInputs, period: Window) -> dict:
    share = next((i.share for i in inputs.usage if i.name == line.instance), 1.0)
    share = 1 - share if line.kind == "other_tenants" else share
    device = inputs.device(line.instance)
    hours = line.device_s * share * (device.gpu_count or 1) / 3600
    month = _month(period.start)
    what = {
        "arm": "device time of",
        "retries": "failed work of",
        "idle": "idle time",
        "outside_view": "requests outside the view, and their part of idle,",
        "other_tenants": "other tenants",
    }
    arm = f" {line.arm}" if line.kind in ("arm", "retries") else (f" charged to {line.arm}" if line.arm else "")
    method = ALLOCATION_METHOD[inputs.idle_method]
    price = device.gpu_hour_usd or 0.0
    row = dict.fromkeys(COLUMNS, "")
    row |= {
        "BilledCost": line.usd,
        "EffectiveCost": line.usd,
        "ListCost": price * hours,
        "ContractedCost": price * hours,
        "BillingAccountId": "specwatch",
        "BillingAccountName": "specwatch deployment",
        "BillingCurrency": "USD",
        "BillingPeriodStart": _iso(month[0]),
        "BillingPeriodEnd": _iso(month[1]),
        "ChargeCategory": "Usage",
        "ChargeDescription": f"{what[line.kind]}{arm} on {line.instance}",
        "ChargeFrequency": "Usage-Based",
        "ChargePeriodStart": _iso(period.start),
        "ChargePeriodEnd": _iso(period.end),
        "ConsumedQuantity": line.output_tokens,
        "ConsumedUnit": "Tokens",
        "InvoiceIssuerName": "specwatch",
        "PricingCategory": PRICING_CATEGORY[device.pricing or "on-demand"],
        "PricingQuantity": hours,
        "PricingUnit": "GPU-Hours",
        "ListUnitPrice": price,
        "ContractedUnitPrice": price,
        "ProviderName": "specwatch",
        "PublisherName": "specwatch",
        "ResourceId": line.instance,
        "ResourceName": line.instance,
        "ResourceType": "LLM inference instance",
        "ServiceCategory": "AI and Machine Learning",
        "ServiceSubcategory": "Generative AI",
        "ServiceName": "LLM inference (speculative decoding)",
        "SkuId": device.gpu_type,
        "SkuPriceId": f"{device.gpu_type}:{device.pricing}",
        "Tags": json.dumps(_tags(line, inputs)),
        "AllocatedMethodId": f"specwatch-{inputs.idle_method}",
        "AllocatedMethodDetails": f"device time x memory share; {method}; the rest of the device to other tenants",
        "AllocatedResourceId": line.instance,
        "AllocatedResourceName": line.instance,
        "AllocatedTags": json.dumps(_tags(line, inputs)),
    }
    return row | _commitment(device, hours)


def _commitment(device: Device, hours: float) -> dict:
    """The commitment columns of a reserved instance's rows (empty otherwise)."""
    if device.pricing != "reserved":
        return {}
    name = device.commitment or f"{device.gpu_type}:reserved"
    return {
        "CommitmentDiscountId": name,
        "CommitmentDiscountName": name,
        "CommitmentDiscountCategory": "Usage",
        "CommitmentDiscountType": "Reserved",
        "CommitmentDiscountStatus": "Used",
        "CommitmentDiscountQuantity": hours,
        "CommitmentDiscountUnit": "GPU-Hours",
    }


def write_focus(rows: list[dict], out) -> None:
    """CSV with the FOCUS header to a path or a text stream."""
    if isinstance(out, io.TextIOBase):
        _write(rows, out)
        return
    with open(out, "w", newline="") as handle:
        _write(rows, handle)


def _write(rows: list[dict], handle) -> None:
    writer = csv.DictWriter(handle, COLUMNS)
    writer.writeheader()
    writer.writerows(replace_floats(row) for row in rows)


def replace_floats(row: dict) -> dict:
    return {k: (repr(float(v)) if isinstance(v, float) else v) for k, v in row.items()}
