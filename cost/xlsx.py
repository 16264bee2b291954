"""The cost model as a spreadsheet a finance team can edit: `write_workbook(inputs, path)`.

Sheet "Inputs" holds every number the model reads (prices, volume, idle time, hidden costs,
and one column per arm of measured figures); sheet "Model" holds the formulas of `cost.model`
as live Excel formulas over "Inputs", so editing a price recomputes every result; sheet
"Assumptions" lists each input's source. Values the store did not measure are written as 0
with a flag or note (energy: $0; target memory: memory_measured 0, the whole device charged).
"""

from __future__ import annotations

import re
from pathlib import Path

from openpyxl import Workbook
from openpyxl.styles import Font
from openpyxl.utils import get_column_letter

from cost.model import (
    GB,
    HIDDEN_FIELDS,
    SECONDS_PER_MONTH,
    CostInputs,
    idle_cost,
    monthly_volume,
    needs_training,
    tco,
)

# name -> (unit, note); values come from the inputs.
GLOBAL_INPUTS = {
    "gpu_hour_usd": ("USD / GPU hour", "price of gpu_type at the pricing in B1's note"),
    "gpu_count": ("GPUs", "GPUs one instance runs on"),
    "gpu_memory_gb": ("GB", "memory of one GPU"),
    "electricity_usd_per_kwh": ("USD / kWh", ""),
    "pue": ("-", "facility energy / IT energy"),
    "energy_added": ("1 / 0", "1: on-prem pays for power; 0: a cloud price includes it (energy shown only)"),
    "storage_usd_per_gb_month": ("USD / GB-month", "monitoring store"),
    "engineer_day_usd": ("USD / person-day", "incidents, opportunity cost"),
    "monthly_output_tokens": ("tokens / month", "volume priced"),
    "idle_factor": ("-", "idle device s per busy s, spread over the arms (0: idle is its own line)"),
    "idle_gpu_hours_month": ("GPU hours / month", "instance time no request used (0: not measured)"),
    "idle_kwh_month": ("kWh / month", "energy while idle (0: not measured)"),
    "draft_training_usd": ("USD", "one training run of the draft model at 10% of the target's data"),
    "training_data_fraction": ("fraction", "the draft's training data / the target's"),
    "amortisation_months": ("months", ""),
    "monitoring_gb_per_day": ("GB / day", "telemetry stored per day"),
    "monitoring_retention_days": ("days", ""),
    "incident_days_per_week": ("person-days / week", ""),
    "opportunity_days_per_month": ("engineer-days / month", "iteration slowdown, learning curve"),
    "tech_debt_buffer": ("fraction", "reserve on top of the speculative deployment's costs"),
}
ARM_INPUTS = {
    "tokens_per_s": "output tokens / device-second attributed to the arm",
    "retry_factor": "device time of failed requests / of ok ones",
    "energy_j_per_token": "J / output token (0: not measured)",
    "memory_measured": "1 if target memory was measured (0: whole devices charged)",
    "target_memory_gb": "GB held by the target",
    "draft_memory_gb": "GB held by the draft",
    "needs_training": "1 if the drafter has trained weights (n-gram, suffix, early exit: 0)",
}
ARM_FIRST_ROW = len(GLOBAL_INPUTS) + 5  # header rows, the globals, a blank row, the arm table's header

# Model rows: label -> formula template. {g:name} a global input, {a:name} this arm's input,
# {m:label} this column's model cell, {plain:label} the plain-decoding column's model cell.
ARM_ROWS = {
    "memory_share": (
        "IF({a:memory_measured}=0,1,({a:target_memory_gb}+{a:draft_memory_gb})/({g:gpu_count}*{g:gpu_memory_gb}))"
    ),
    "gpu_hours_per_mtok": "{g:gpu_count}*1000000/{a:tokens_per_s}/3600",
    "compute_usd_per_mtok": "{m:gpu_hours_per_mtok}*{g:gpu_hour_usd}*{m:memory_share}",
    "energy_kwh_per_mtok": "{a:energy_j_per_token}*1000000/3600000",
    "energy_usd_per_mtok": "{m:energy_kwh_per_mtok}*{g:pue}*{g:electricity_usd_per_kwh}",
    "retry_factor": "{a:retry_factor}",
    "retries_usd_per_mtok": ("({m:compute_usd_per_mtok}+{m:energy_usd_per_mtok}*{g:energy_added})*{m:retry_factor}"),
    "idle_usd_per_mtok": "{m:compute_usd_per_mtok}*{g:idle_factor}",
    "total_usd_per_mtok": (
        "{m:compute_usd_per_mtok}+{m:energy_usd_per_mtok}*{g:energy_added}+{m:retries_usd_per_mtok}"
        "+{m:idle_usd_per_mtok}"
    ),
    "monthly_usd": "{m:total_usd_per_mtok}*{g:monthly_output_tokens}/1000000",
}
_TRAINING_RUN = "{g:draft_training_usd}*{g:training_data_fraction}/0.1*{a:needs_training}"
_RECURRING = "({m:hidden_usd_month}-{m:draft_training_usd_month}*(1+{g:tech_debt_buffer}))"  # hidden costs but training
BENEFIT_ROWS = {
    "draft_training_usd_month": f"{_TRAINING_RUN}/{{g:amortisation_months}}",
    "monitoring_usd_month": "{g:monitoring_gb_per_day}*{g:monitoring_retention_days}*{g:storage_usd_per_gb_month}",
    "incidents_usd_month": "{g:incident_days_per_week}*52/12*{g:engineer_day_usd}",
    "opportunity_usd_month": "{g:opportunity_days_per_month}*{g:engineer_day_usd}",
    "tech_debt_usd_month": (
        "{g:tech_debt_buffer}*({m:monthly_usd}+{m:draft_training_usd_month}+{m:monitoring_usd_month}"
        "+{m:incidents_usd_month}+{m:opportunity_usd_month})"
    ),
    "hidden_usd_month": (
        "{m:draft_training_usd_month}+{m:monitoring_usd_month}+{m:incidents_usd_month}+{m:opportunity_usd_month}"
        "+{m:tech_debt_usd_month}"
    ),
    "explicit_saving_usd_month": "{plain:monthly_usd}-{m:monthly_usd}",
    "net_benefit_usd_month": "{m:explicit_saving_usd_month}-{m:hidden_usd_month}",
    # saving net of the recurring hidden costs (with buffer) > 0: training / that saving, else "never"
    "payback_months": (
        f"IF({{m:explicit_saving_usd_month}}-{_RECURRING}>0,"
        f'{_TRAINING_RUN}/({{m:explicit_saving_usd_month}}-{_RECURRING}),"never")'
    ),
}
IDLE_ROW = "idle_usd_month"  # one cell, column B, below the arms' rows
IDLE_FORMULA = (
    "{g:idle_gpu_hours_month}*{g:gpu_hour_usd}+{g:idle_kwh_month}*{g:pue}*{g:electricity_usd_per_kwh}*{g:energy_added}"
)
MODEL_ROW = {label: i + 2 for i, label in enumerate([*ARM_ROWS, *BENEFIT_ROWS, IDLE_ROW])}


def global_values(inputs: CostInputs) -> dict[str, float]:
    h, p = inputs.hidden, inputs.prices
    idle = idle_cost(inputs)
    idle_hours = 0.0 if idle is None else idle.idle_s / 3600 * inputs.gpu_count * SECONDS_PER_MONTH / inputs.window_s
    return {
        "gpu_hour_usd": inputs.gpu_hour_usd,
        "gpu_count": inputs.gpu_count,
        "gpu_memory_gb": inputs.device_memory_bytes / GB,
        "electricity_usd_per_kwh": p.electricity_usd_per_kwh,
        "pue": p.pue,
        "energy_added": int(inputs.energy_added),
        "storage_usd_per_gb_month": p.storage_usd_per_gb_month,
        "engineer_day_usd": p.engineer_day_usd,
        "monthly_output_tokens": monthly_volume(inputs)[0],
        "idle_factor": inputs.idle_factor,
        "idle_gpu_hours_month": idle_hours,
        "idle_kwh_month": (idle.energy_kwh_per_month or 0.0) if idle else 0.0,
        **{name: getattr(h, name) for name in HIDDEN_FIELDS},
    }


def arm_values(arm) -> dict[str, float]:
    return {
        "tokens_per_s": arm.tokens_per_s,
        "retry_factor": arm.retry_factor,
        "energy_j_per_token": arm.energy_j_per_token or 0.0,
        "memory_measured": int(arm.target_memory_bytes is not None),
        "target_memory_gb": (arm.target_memory_bytes or 0.0) / GB,
        "draft_memory_gb": arm.draft_memory_bytes / GB,
        "needs_training": int(needs_training(arm.drafter)),
    }


def write_workbook(inputs: CostInputs, path: Path) -> None:
    """Inputs + Model sheets (module docstring). The plain-decoding arm is column B of both tables."""
    arms = sorted(inputs.arms, key=lambda arm: arm.mode != "autoregressive")
    book = Workbook()
    _inputs_sheet(book.active, inputs, arms)
    _model_sheet(book.create_sheet("Model"), arms, has_plain=inputs.baseline is not None)
    _assumptions_sheet(book.create_sheet("Assumptions"), inputs)
    book.save(path)


def _inputs_sheet(sheet, inputs: CostInputs, arms) -> None:
    sheet.title = "Inputs"
    note = f"{inputs.pricing} prices as of {inputs.prices.as_of}; edit the values in column B"
    sheet.append(["gpu_type", inputs.gpu_type, "", note])
    sheet.append(["input", "value", "unit", "note"])
    volume_source = monthly_volume(inputs)[1]
    for name, value in global_values(inputs).items():
        unit, note = GLOBAL_INPUTS[name]
        sheet.append([name, value, unit, f"{note} ({volume_source})" if name == "monthly_output_tokens" else note])
    sheet.append([])
    sheet.append(["arm", *(arm.key for arm in arms)])
    for name, note in ARM_INPUTS.items():
        sheet.append([name, *(arm_values(arm)[name] for arm in arms), note])
    sheet.append(["energy_source", *(arm.energy_source or "not measured" for arm in arms)])
    for row in (1, 2, ARM_FIRST_ROW - 1):
        for cell in sheet[row]:
            cell.font = Font(bold=True)
    sheet.column_dimensions["A"].width = 28


def input_ref(name: str, column: str | None = None) -> str:
    """The Inputs cell of a global input (absolute) or of an arm input in `column`."""
    if column is None:
        return f"Inputs!$B${list(GLOBAL_INPUTS).index(name) + 3}"
    return f"Inputs!{column}{list(ARM_INPUTS).index(name) + ARM_FIRST_ROW}"


def _cell(kind: str, name: str, column: str) -> str:
    if kind == "g":
        return input_ref(name)
    if kind == "a":
        return input_ref(name, column)
    return f"{column}{MODEL_ROW[name]}" if kind == "m" else f"$B${MODEL_ROW[name]}"  # plain: column B


def formula(template: str, column: str) -> str:
    """Fill a template's {g:..}, {a:..}, {m:..}, {plain:..} references for the arm in `column`."""
    return "=" + re.sub(r"\{(g|a|m|plain):(\w+)\}", lambda m: _cell(m.group(1), m.group(2), column), template)


def _model_sheet(sheet, arms, has_plain: bool) -> None:
    sheet.append(["USD (per 1M output tokens, or per month)", *(arm.key for arm in arms)])
    for label, template in ARM_ROWS.items():
        sheet.append([label, *(formula(template, get_column_letter(i + 2)) for i in range(len(arms)))])
    for label, template in BENEFIT_ROWS.items():
        cells = [
            formula(template, get_column_letter(i + 2)) if arm.mode == "speculative" and has_plain else None
            for i, arm in enumerate(arms)
        ]
        sheet.append([label, *cells])
    sheet.append([IDLE_ROW, formula(IDLE_FORMULA, "B")])
    for cell in sheet[1]:
        cell.font = Font(bold=True)
    sheet.column_dimensions["A"].width = 34


def _assumptions_sheet(sheet, inputs: CostInputs) -> None:
    """Every input with its value and source (cost.assumptions), as the report shows them."""
    sheet.append(["input", "value", "unit", "source"])
    for row in tco(inputs).assumptions:
        sheet.append([row.name, row.value, row.unit, row.source])
    for cell in sheet[1]:
        cell.font = Font(bold=True)
    sheet.column_dimensions["A"].width = 40
