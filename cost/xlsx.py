"""The cost model as a spreadsheet a finance team can edit: `write_workbook(inputs, path)`.

Sheet "Inputs" holds every number the model reads (prices, volume, hidden costs, and one
column per arm of measured figures); sheet "Model" holds the formulas of `cost.model`
as live Excel formulas over "Inputs", so editing a price recomputes every result. Values
the store did not measure are written as 0 with a note (energy: counted as $0; target
memory: the whole device is charged).
"""

from __future__ import annotations

import re
from pathlib import Path

from openpyxl import Workbook
from openpyxl.styles import Font
from openpyxl.utils import get_column_letter

from cost.model import GB, CostInputs, monthly_volume, needs_training

# name -> (unit, note); values come from the inputs.
GLOBAL_INPUTS = {
    "gpu_hour_usd": ("USD / GPU hour", "on-demand price of gpu_type"),
    "gpu_count": ("GPUs", "GPUs one instance runs on"),
    "gpu_memory_gb": ("GB", "memory of one GPU"),
    "electricity_usd_per_kwh": ("USD / kWh", ""),
    "pue": ("-", "facility energy / IT energy"),
    "storage_usd_per_gb_month": ("USD / GB-month", "monitoring store"),
    "engineer_day_usd": ("USD / person-day", "incident handling"),
    "monthly_output_tokens": ("tokens / month", "volume priced"),
    "draft_training_usd": ("USD", "one training run of the draft model"),
    "amortisation_months": ("months", ""),
    "monitoring_gb_per_day": ("GB / day", "telemetry stored per day"),
    "monitoring_retention_days": ("days", ""),
    "incident_days_per_week": ("person-days / week", ""),
    "tech_debt_buffer": ("fraction", "added on top of the hidden costs"),
}
ARM_INPUTS = {
    "tokens_per_s": "output tokens / s while serving",
    "requests": "requests measured",
    "retries": "retried attempts",
    "energy_j_per_token": "J / output token (0: not measured)",
    "target_memory_gb": "GB held by the target (0: not measured, whole devices charged)",
    "draft_memory_gb": "GB held by the draft",
    "needs_training": "1 if the drafter has trained weights (n-gram: 0)",
}
ARM_FIRST_ROW = len(GLOBAL_INPUTS) + 5  # header rows, the globals, a blank row, the arm table's header

# Model rows: label -> formula template. {g:name} a global input, {a:name} this arm's input,
# {m:label} this column's model cell, {plain:label} the plain-decoding column's model cell.
ARM_ROWS = {
    "memory_share": (
        "IF({a:target_memory_gb}=0,1,({a:target_memory_gb}+{a:draft_memory_gb})/({g:gpu_count}*{g:gpu_memory_gb}))"
    ),
    "gpu_hours_per_mtok": "{g:gpu_count}*1000000/{a:tokens_per_s}/3600",
    "compute_usd_per_mtok": "{m:gpu_hours_per_mtok}*{g:gpu_hour_usd}*{m:memory_share}",
    "energy_kwh_per_mtok": "{a:energy_j_per_token}*1000000/3600000",
    "energy_usd_per_mtok": "{m:energy_kwh_per_mtok}*{g:pue}*{g:electricity_usd_per_kwh}",
    "retry_factor": "IF({a:requests}=0,0,{a:retries}/{a:requests})",
    "retries_usd_per_mtok": "({m:compute_usd_per_mtok}+{m:energy_usd_per_mtok})*{m:retry_factor}",
    "total_usd_per_mtok": "{m:compute_usd_per_mtok}+{m:energy_usd_per_mtok}+{m:retries_usd_per_mtok}",
    "monthly_usd": "{m:total_usd_per_mtok}*{g:monthly_output_tokens}/1000000",
}
BENEFIT_ROWS = {
    "draft_training_usd_month": "{g:draft_training_usd}/{g:amortisation_months}*{a:needs_training}",
    "monitoring_usd_month": "{g:monitoring_gb_per_day}*{g:monitoring_retention_days}*{g:storage_usd_per_gb_month}",
    "incidents_usd_month": "{g:incident_days_per_week}*52/12*{g:engineer_day_usd}",
    "tech_debt_usd_month": (
        "{g:tech_debt_buffer}*({m:draft_training_usd_month}+{m:monitoring_usd_month}+{m:incidents_usd_month})"
    ),
    "hidden_usd_month": (
        "{m:draft_training_usd_month}+{m:monitoring_usd_month}+{m:incidents_usd_month}+{m:tech_debt_usd_month}"
    ),
    "explicit_saving_usd_month": "{plain:monthly_usd}-{m:monthly_usd}",
    "net_benefit_usd_month": "{m:explicit_saving_usd_month}-{m:hidden_usd_month}",
    # saving net of the recurring hidden costs (with buffer) > 0: training / that saving, else "never"
    "payback_months": (
        "IF({m:explicit_saving_usd_month}-({m:monitoring_usd_month}+{m:incidents_usd_month})"
        "*(1+{g:tech_debt_buffer})>0,{g:draft_training_usd}*{a:needs_training}/({m:explicit_saving_usd_month}"
        '-({m:monitoring_usd_month}+{m:incidents_usd_month})*(1+{g:tech_debt_buffer})),"never")'
    ),
}
MODEL_ROW = {label: i + 2 for i, label in enumerate([*ARM_ROWS, *BENEFIT_ROWS])}


def global_values(inputs: CostInputs) -> dict[str, float]:
    h, p = inputs.hidden, inputs.prices
    return {
        "gpu_hour_usd": inputs.gpu_hour_usd,
        "gpu_count": inputs.gpu_count,
        "gpu_memory_gb": inputs.device_memory_bytes / GB,
        "electricity_usd_per_kwh": p.electricity_usd_per_kwh,
        "pue": p.pue,
        "storage_usd_per_gb_month": p.storage_usd_per_gb_month,
        "engineer_day_usd": p.engineer_day_usd,
        "monthly_output_tokens": monthly_volume(inputs)[0],
        "draft_training_usd": h.draft_training_usd,
        "amortisation_months": h.amortisation_months,
        "monitoring_gb_per_day": h.monitoring_gb_per_day,
        "monitoring_retention_days": h.monitoring_retention_days,
        "incident_days_per_week": h.incident_days_per_week,
        "tech_debt_buffer": h.tech_debt_buffer,
    }


def arm_values(arm) -> dict[str, float]:
    return {
        "tokens_per_s": arm.tokens_per_s,
        "requests": arm.requests,
        "retries": arm.retries,
        "energy_j_per_token": arm.energy_j_per_token or 0.0,
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
    book.save(path)


def _inputs_sheet(sheet, inputs: CostInputs, arms) -> None:
    sheet.title = "Inputs"
    sheet.append(["gpu_type", inputs.gpu_type, "", f"prices as of {inputs.prices.as_of}; edit the values in column B"])
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
    for cell in sheet[1]:
        cell.font = Font(bold=True)
    sheet.column_dimensions["A"].width = 34
