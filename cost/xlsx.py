"""The cost model as a spreadsheet a finance team can edit: `write_workbook(inputs, path, concurrency)`.

Sheet "Inputs" holds every number the model reads (prices, volume, hidden costs, one column per arm
of measured figures, per ok device-second, and a fleet table: one row per instance with its own GPU
type, gpu_count, pricing and $/GPU-hour, a reference to the global cells where it is priced as the
inputs' GPU); "Lines" holds the window's allocation (`cost.allocation`): one row per line with its
instance-seconds, share and kWh, its $ a live formula of its instance's gpu_count and GPU-hour price
cells and the energy prices, each instance's bill the same way, and a check cell (Σ lines - Σ bills
= 0); the arms' $ per ok device-second are formulas over their lines; "Model" holds `cost.model`'s
formulas over both, so editing a price recomputes every result; "Concurrency" and "Break-even" the
binned costs (the one crossover) and the speed-up curve S(alpha) = E x t_plain / (t_verify + gamma
t_draft) as formulas of their inputs; "Assumptions" lists each input's source.
"""

from __future__ import annotations

import re
from pathlib import Path

from openpyxl import Workbook
from openpyxl.styles import Font
from openpyxl.utils import get_column_letter

from specwatch.cost.allocation import Allocation, allocate
from specwatch.cost.concurrency import ConcurrencyCosts
from specwatch.cost.model import (
    GB,
    HIDDEN_FIELDS,
    CostInputs,
    ModeMeasure,
    _month_scale,
    draft_fraction,
    energy_weights,
    memory_share,
    monthly_volume,
    needs_training,
    tco,
)
from specwatch.cost.xlsx_sheets import LINES_FIRST_ROW, break_even_sheet, concurrency_sheet, lines_sheet, text

# name -> (unit, note); values come from the inputs.
GLOBAL_INPUTS = {
    "gpu_hour_usd": ("USD / GPU hour", "price of gpu_type at the pricing in B1's note (fleet rows priced as it)"),
    "gpu_count": ("GPUs", "GPUs one instance runs on (fleet rows that name none)"),
    "gpu_memory_gb": ("GB", "memory of one GPU"),
    "electricity_usd_per_kwh": ("USD / kWh", ""),
    "pue": ("-", "facility energy / IT energy"),
    "energy_added": ("1 / 0", "1: on-prem pays for power; 0: a cloud price includes it (energy shown only)"),
    "storage_usd_per_gb_month": ("USD / GB-month", "monitoring store"),
    "engineer_day_usd": ("USD / person-day", "incidents, opportunity cost"),
    "monthly_output_tokens": ("tokens / month", "volume priced"),
    "month_scale": ("-", "window $ -> monthly $: the volume priced / the window's ok tokens"),
    "reserve_on_additions": ("1 / 0", "1: the reserve is a fraction of what speculation adds; 0: of its deployment"),
    "draft_training_usd": ("USD", "one training run of the draft model at 10% of the target's data"),
    "training_data_fraction": ("fraction", "the draft's training data / the target's"),
    "amortisation_months": ("months", ""),
    "monitoring_gb_per_day": ("GB / day", "telemetry stored per day"),
    "monitoring_retention_days": ("days", ""),
    "incident_days_per_week": ("person-days / week", ""),
    "opportunity_days_per_month": ("engineer-days / month", "iteration slowdown, learning curve"),
    "tech_debt_buffer": ("fraction", "the technical-debt reserve (base: reserve_on_additions)"),
}
ARM_INPUTS = {
    "tokens_per_s": "output tokens / ok device-second attributed to the arm",
    "memory_share": "the deployment's share of its devices, weighted by the arm's device time",
    "gpu_count": "GPUs per instance it ran on, weighted by its ok device time (fleet table)",
    "retry_factor": "device time of failed work / of ok work",
    "compute_usd_s": "its arm lines' compute $ per ok device-second (Lines: each instance at its own price)",
    "retries_usd_s": "its retries lines' $ per ok device-second (Lines)",
    "idle_usd_s": "idle lines' $ charged to the arm per ok device-second (Lines)",
    "energy_j_per_token": "J / ok output token (0: not measured)",
    "energy_share": "the share its energy is charged at",
    "energy_added": "the part of its energy on instances that pay for power (on-prem)",
    "needs_training": "1 if the drafter has trained weights (n-gram, suffix, early exit: 0)",
    "draft_fraction": "drafting time / the arm's device time",
    "draft_memory_usd_hour": "the draft's memory share of each instance it ran on x that instance's $ / hour",
    "instances": "instances the arm ran on",
}
ARM_FIRST_ROW = len(GLOBAL_INPUTS) + 5  # header rows, the globals, a blank row, the arm table's header
FLEET_FIRST_ROW = ARM_FIRST_ROW + len(ARM_INPUTS) + 3  # the arm table, energy_source, a blank row, a header
FLEET_COLUMNS = {  # name -> column of the fleet table
    "instance": "A",
    "gpu_type": "B",
    "gpu_count": "C",
    "pricing": "D",
    "gpu_hour_usd": "E",
    "energy_added": "F",
    "source": "G",
}

# Model rows: label -> formula template. {g:name} a global input, {a:name} this arm's input,
# {m:label} this column's model cell, {plain:label} the plain-decoding column's model cell.
ARM_ROWS = {
    "memory_share": "{a:memory_share}",
    "gpu_hours_per_mtok": "{a:gpu_count}*1000000/{a:tokens_per_s}/3600",
    "compute_usd_per_mtok": "1000000/{a:tokens_per_s}*{a:compute_usd_s}",
    "energy_kwh_per_mtok": "{a:energy_j_per_token}*1000000/3600000",
    "energy_usd_per_mtok": "{m:energy_kwh_per_mtok}*{g:pue}*{g:electricity_usd_per_kwh}*{a:energy_share}",
    "retry_factor": "{a:retry_factor}",
    "retries_usd_per_mtok": "1000000/{a:tokens_per_s}*{a:retries_usd_s}",
    "idle_usd_per_mtok": "1000000/{a:tokens_per_s}*{a:idle_usd_s}",
    "total_usd_per_mtok": (
        "{m:compute_usd_per_mtok}+{m:energy_usd_per_mtok}*{a:energy_added}+{m:retries_usd_per_mtok}"
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
    "draft_device_usd_month": "{m:monthly_usd}*{a:draft_fraction}",
    "draft_memory_usd_month": "{a:draft_memory_usd_hour}*730",
    "tech_debt_usd_month": (
        "{g:tech_debt_buffer}*(IF({g:reserve_on_additions}=1,{m:draft_device_usd_month}+{m:draft_memory_usd_month},"
        "{m:monthly_usd})+{m:draft_training_usd_month}+{m:monitoring_usd_month}"
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
IDLE_FORMULA = "({idle_lines})*{g:month_scale}"  # the Lines sheet's idle cells, a month of them
MODEL_ROW = {label: i + 2 for i, label in enumerate([*ARM_ROWS, *BENEFIT_ROWS, IDLE_ROW])}


def global_values(inputs: CostInputs, allocation: Allocation) -> dict[str, float]:
    h, p = inputs.hidden, inputs.prices
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
        "month_scale": _month_scale(inputs, allocation),
        "reserve_on_additions": int(h.reserve_base == "additions"),
        **{name: getattr(h, name) for name in HIDDEN_FIELDS},
    }


def arm_values(arm: ModeMeasure, inputs: CostInputs, allocation: Allocation) -> dict[str, float | str]:
    """The arm's column of the Inputs sheet: measured values, and formulas over its lines and the fleet table."""
    uses = [(i, u) for i in inputs.usage for u in i.arms if u.arm == arm.key]
    joules = sum(u.energy_j or 0.0 for _, u in uses)
    lines = _ArmLines(arm.key, allocation)
    return {
        "tokens_per_s": arm.tokens_per_s,
        "memory_share": memory_share(arm, inputs),
        "gpu_count": lines.weighted("gpu_count", input_ref("gpu_count")),
        "retry_factor": arm.retry_factor,
        "compute_usd_s": lines.per_ok_s("arm", "I"),
        "retries_usd_s": lines.per_ok_s("retries", "G"),
        "idle_usd_s": lines.per_ok_s("idle", "G"),
        "energy_j_per_token": arm.energy_j_per_token or 0.0,
        "energy_share": (
            sum(i.share * (u.energy_j or 0.0) for i, u in uses) / joules if joules > 0 else memory_share(arm, inputs)
        ),
        "energy_added": _energy_added(arm, inputs, allocation),
        "needs_training": int(needs_training(arm.drafter)),
        "draft_fraction": draft_fraction(arm),
        "draft_memory_usd_hour": _draft_memory(arm, inputs, allocation, [i.name for i, _ in uses]),
        "instances": max(len(uses), 1),
    }


class _ArmLines:
    """The Lines rows of one arm, and formulas over them."""

    def __init__(self, key: str, allocation: Allocation) -> None:
        self.allocation = allocation
        self.rows = [(i + LINES_FIRST_ROW, x) for i, x in enumerate(allocation.lines) if x.arm == key]
        self.ok = [(row, x) for row, x in self.rows if x.kind == "arm"]
        self.ok_s = "+".join(f"Lines!D{row}" for row, _ in self.ok)
        self.seconds = sum(x.device_s for _, x in self.ok)

    def per_ok_s(self, kind: str, column: str) -> float | str:
        """Σ of `column` over its lines of `kind` / its ok device-seconds (0 without any)."""
        cells = [f"Lines!{column}{row}" for row, x in self.rows if x.kind == kind]
        return f"=({'+'.join(cells)})/({self.ok_s})" if cells and self.seconds > 0 else 0.0

    def weighted(self, name: str, otherwise: str) -> str:
        """A fleet table column weighted by its ok device-seconds per instance (`otherwise` without any)."""
        if self.seconds <= 0:
            return f"={otherwise}"
        rows = fleet_rows(self.allocation)
        terms = [f"Lines!D{row}*{fleet_ref(rows[x.instance], name)}" for row, x in self.ok]
        return f"=({'+'.join(terms)})/({self.ok_s})"


def _energy_added(arm: ModeMeasure, inputs: CostInputs, allocation: Allocation) -> str:
    """The fleet table's energy_added weighted as `cost.model.energy_added_part` weighs it."""
    weights = [(name, w) for name, w in energy_weights(arm, inputs) if w > 0]
    if not weights:
        return f"={input_ref('energy_added')}"
    rows = fleet_rows(allocation)
    terms = "+".join(f"{w!r}*{fleet_ref(rows[name], 'energy_added')}" for name, w in weights)
    return f"=({terms})/({sum(w for _, w in weights)!r})"


def _draft_memory(arm: ModeMeasure, inputs: CostInputs, allocation: Allocation, names: list[str]) -> str | float:
    """Σ over its instances of min(draft / their GPUs' memory, 1) x gpu_count x $/GPU-hour, live over the
    fleet table (the global cells when it ran on none), as `cost.hidden.draft_memory_hourly`."""
    if arm.draft_memory_bytes <= 0:
        return 0.0
    draft_gb, rows = arm.draft_memory_bytes / GB, fleet_rows(allocation)
    terms = []
    for name in names or [""]:
        memory_gb = inputs.memory_bytes_of(inputs.device(name)) / GB
        refs = (fleet_ref(rows[name], "gpu_count"), fleet_ref(rows[name], "gpu_hour_usd")) if name else None
        count, price = refs or (input_ref("gpu_count"), input_ref("gpu_hour_usd"))
        terms.append(f"MIN({draft_gb!r}/({count}*{memory_gb!r}),1)*{count}*{price}")
    return "=" + "+".join(terms)


def fleet_rows(allocation: Allocation) -> dict[str, int]:
    """Instance -> its row of the fleet table (one per bill)."""
    return {bill.instance: FLEET_FIRST_ROW + k for k, bill in enumerate(allocation.bills)}


def fleet_ref(row: int, name: str) -> str:
    """The fleet table's cell `name` of row `row` (absolute)."""
    return f"Inputs!${FLEET_COLUMNS[name]}${row}"


def fleet_values(inputs: CostInputs, allocation: Allocation) -> list[list]:
    """One row per instance: its own figures, or a reference to the global cell where they are the same."""
    table = []
    for bill in allocation.bills:
        device = inputs.device(bill.instance)
        same = (device.gpu_type, device.pricing, device.gpu_hour_usd) == (
            inputs.gpu_type,
            inputs.pricing,
            inputs.gpu_hour_usd,
        )
        price = f"={input_ref('gpu_hour_usd')}" if same else device.gpu_hour_usd
        count = f"={input_ref('gpu_count')}" if device.gpu_count == inputs.gpu_count else device.gpu_count
        energy = f"={input_ref('energy_added')}" if device.pricing == inputs.pricing else int(device.energy_added)
        names = (text(bill.instance), text(device.gpu_type))
        table.append([*names, count, device.pricing, price, energy, text(device.source)])
    return table


def write_workbook(
    inputs: CostInputs, path: Path, concurrency: ConcurrencyCosts | None = None, view: str = "all requests"
) -> None:
    """Inputs, Lines, Model, Concurrency, Break-even and Assumptions (module docstring). The plain-decoding
    arm is column B of the arm tables; `view` names what the charged lines are charged to ("tenant=acme")."""
    arms = sorted(inputs.arms, key=lambda arm: arm.mode != "autoregressive")
    allocation = allocate(inputs)
    book = Workbook()
    _inputs_sheet(book.active, inputs, arms, allocation)
    rows = fleet_rows(allocation)
    lines = book.create_sheet("Lines")
    idle_cells = lines_sheet(lines, allocation, input_ref, lambda i, n: fleet_ref(rows[i], n), view)
    _model_sheet(book.create_sheet("Model"), arms, inputs.baseline is not None, idle_cells)
    concurrency_sheet(book.create_sheet("Concurrency"), concurrency)
    break_even_sheet(book.create_sheet("Break-even"), inputs)
    _assumptions_sheet(book.create_sheet("Assumptions"), inputs)
    book.save(path)


def _inputs_sheet(sheet, inputs: CostInputs, arms, allocation: Allocation) -> None:
    sheet.title = "Inputs"
    note = f"{inputs.pricing} prices as of {inputs.prices.as_of}; edit the values in column B"
    sheet.append(["gpu_type", text(inputs.gpu_type), "", note])
    sheet.append(["input", "value", "unit", "note"])
    volume_source = monthly_volume(inputs)[1]
    for name, value in global_values(inputs, allocation).items():
        unit, note = GLOBAL_INPUTS[name]
        sheet.append([name, value, unit, f"{note} ({volume_source})" if name == "monthly_output_tokens" else note])
    sheet.append([])
    sheet.append(["arm", *(text(arm.key) for arm in arms)])
    columns = [arm_values(arm, inputs, allocation) for arm in arms]
    for name, note in ARM_INPUTS.items():
        sheet.append([name, *(column[name] for column in columns), note])
    sheet.append(["energy_source", *(arm.energy_source or "not measured" for arm in arms)])
    sheet.append([])
    sheet.append(list(FLEET_COLUMNS))
    for values in fleet_values(inputs, allocation):
        sheet.append(values)
    for row in (1, 2, ARM_FIRST_ROW - 1, FLEET_FIRST_ROW - 1):
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


def _model_sheet(sheet, arms, has_plain: bool, idle_cells: list[str]) -> None:
    sheet.append(["USD (per 1M output tokens, or per month)", *(text(arm.key) for arm in arms)])
    for label, template in ARM_ROWS.items():
        sheet.append([label, *(formula(template, get_column_letter(i + 2)) for i in range(len(arms)))])
    for label, template in BENEFIT_ROWS.items():
        cells = [
            formula(template, get_column_letter(i + 2)) if arm.mode == "speculative" and has_plain else None
            for i, arm in enumerate(arms)
        ]
        sheet.append([label, *cells])
    idle = IDLE_FORMULA.replace("{idle_lines}", "+".join(idle_cells) or "0")
    sheet.append([IDLE_ROW, formula(idle, "B")])
    for cell in sheet[1]:
        cell.font = Font(bold=True)
    sheet.column_dimensions["A"].width = 34


def _assumptions_sheet(sheet, inputs: CostInputs) -> None:
    """Every input with its value and source (cost.assumptions), as the report shows them."""
    sheet.append(["input", "value", "unit", "source"])
    for row in tco(inputs).assumptions:
        sheet.append([row.name, text(row.value), row.unit, text(row.source)])
    for cell in sheet[1]:
        cell.font = Font(bold=True)
    sheet.column_dimensions["A"].width = 40
