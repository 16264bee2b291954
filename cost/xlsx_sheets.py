"""The workbook's Lines, Concurrency and Break-even sheets (`cost.xlsx` writes the rest).

Lines: one row per allocation line and per instance bill; compute $ = seconds x share x gpu_count x
$/GPU-hour / 3600 and energy $ = kWh x share x PUE x $/kWh x energy_added, with gpu_count, $/GPU-hour
and energy_added its instance's cells of the Inputs sheet's fleet table; a check cell holds
Σ lines - Σ bills (0). Concurrency: the binned rows, $ per 1M tokens a formula of their $ and tokens,
each group's crossover as `cost.concurrency.crossing` found it. Break-even: gamma and the three step times as
inputs, S(alpha) per alpha as a formula, the break-even alpha beside it.
"""

from __future__ import annotations

from collections.abc import Callable

from openpyxl.cell.rich_text import CellRichText
from openpyxl.styles import Font

from specwatch.cost.allocation import Allocation
from specwatch.cost.breakeven import break_even
from specwatch.cost.concurrency import ConcurrencyCosts
from specwatch.cost.model import CostInputs

LINE_HEADER = [
    *("instance", "kind", "arm", "instance_s", "share", "kwh", "usd", "estimate", "compute_usd", "energy_usd"),
    "charged_to",  # the view the line is charged to (its work, retries, idle); empty: outside it
]
CHARGED = ("arm", "retries", "idle")  # the kinds of line a view is charged
BILL_HEADER = ["bill", "instance", "", "billed_s", "", "kwh", "usd", "estimate", "compute_usd", "energy_usd", "source"]
LINES_FIRST_ROW = 2


def text(value: object) -> object:
    """A producer's string (an instance, a drafter) as a text cell: openpyxl writes any string that
    starts with `=` as a formula, so `=HYPERLINK(...)` in an instance name would run in Excel. Rich
    text is always written as a string."""
    return CellRichText(value) if isinstance(value, str) and value.startswith("=") else value


def _bold(sheet, row: int = 1) -> None:
    for cell in sheet[row]:
        cell.font = Font(bold=True)


def lines_sheet(
    sheet,
    allocation: Allocation,
    ref: Callable[[str], str],
    instance_ref: Callable[[str, str], str],
    view: str = "all requests",
) -> list[str]:
    """Write the lines and bills (`ref`: a global input's cell; `instance_ref(instance, name)`: that instance's
    gpu_count, gpu_hour_usd or energy_added cell), each line's `charged_to` the view (a tenant's, a tag's) or
    empty; return the cells of the idle lines (the Model sums them)."""
    kwh = f"{ref('pue')}*{ref('electricity_usd_per_kwh')}"
    shares = {b.instance: b.share for b in allocation.bills}

    def usd(row: int, instance: str, share: str) -> list[str]:
        second = f"{instance_ref(instance, 'gpu_count')}*{instance_ref(instance, 'gpu_hour_usd')}/3600"
        energy = f"{kwh}*{instance_ref(instance, 'energy_added')}"
        return [f"=I{row}+J{row}", f"=D{row}*{share}{second}", f"=F{row}*{share}{energy}"]

    sheet.append(LINE_HEADER)
    idle = []
    for row, line in enumerate(allocation.lines, start=LINES_FIRST_ROW):
        share = 1 - shares[line.instance] if line.kind == "other_tenants" else shares[line.instance]
        total, compute, energy = usd(row, line.instance, f"E{row}*")
        values = [text(line.instance), line.kind, text(line.arm), line.device_s, share, line.energy_kwh or 0.0]
        charged = text(view) if line.kind in CHARGED else ""
        sheet.append([*values, total, int(line.estimate), compute, energy, charged])
        if line.kind == "idle":
            idle.append(f"Lines!G{row}")
    last = LINES_FIRST_ROW + len(allocation.lines) - 1
    sheet.append([])
    sheet.append(BILL_HEADER)
    _bold(sheet, sheet.max_row)
    bill_first = sheet.max_row + 1
    for bill in allocation.bills:
        row = sheet.max_row + 1
        total, compute, energy = usd(row, bill.instance, "")
        values = ["bill", text(bill.instance), "", bill.billed_s, 1, bill.energy_kwh or 0.0, total, int(bill.estimate)]
        sheet.append([*values, compute, energy, text(bill.source)])
    bill_last = sheet.max_row
    lines_sum = f"SUM(G{LINES_FIRST_ROW}:G{last})" if allocation.lines else "0"
    bills_sum = f"SUM(G{bill_first}:G{bill_last})" if allocation.bills else "0"
    sheet.append(["Σ lines", "", "", "", "", "", f"={lines_sum}"])
    sheet.append(["Σ bills", "", "", "", "", "", f"={bills_sum}"])
    sheet.append(["Σ lines - Σ bills", "", "", "", "", "", f"={lines_sum}-{bills_sum}"])
    _bold(sheet)
    sheet.column_dimensions["A"].width = 20
    return idle


def concurrency_sheet(sheet, costs: ConcurrencyCosts | None) -> None:
    sheet.append(["level", "mode", "requests", "output_tokens", "usd", "usd_per_mtok", "usd_low", "usd_high", "enough"])
    for row in costs.rows if costs else ():
        n = sheet.max_row + 1
        usd = row.usd_per_mtok * row.output_tokens / 1e6
        values = [row.level, row.mode, row.requests, row.output_tokens, usd, f"=E{n}/D{n}*1000000"]
        sheet.append([*values, row.usd_low, row.usd_high, int(row.enough)])
    sheet.append([])
    for group in costs.groups if costs is not None else ():
        crossing = "none" if group.crossover.level is None else group.crossover.level
        who = f"{group.drafter or 'speculation'} on {group.gpu_type}"
        sheet.append(
            [f"crossover of {who} (speculation costs more from this level on)", crossing, group.crossover.reason]
        )
    if costs is not None:
        sheet.append(["min requests / min tokens per level", costs.rules.min_requests, costs.rules.min_tokens])
    _bold(sheet)


def break_even_sheet(sheet, inputs: CostInputs) -> None:
    """Per speculative arm: inputs in rows, S(alpha) at 21 alphas as formulas."""
    for b in break_even(inputs):
        start = sheet.max_row + (1 if sheet.max_row > 1 else 0)
        sheet.append(["arm", text(b.key), text(b.source)])
        g, tp, tv, td = (start + i for i in range(1, 5))
        times = (
            ("gamma", b.gamma),
            ("t_plain_s", b.t_plain_s),
            ("t_verify_s", b.t_verify_s),
            ("t_draft_s", b.t_draft_s),
        )
        for name, value in times:
            sheet.append([name, "not measured" if value is None else value])
        sheet.append(["break-even alpha", "n/a" if b.speedup_alpha is None else b.speedup_alpha])
        sheet.append(["alpha", "speed-up"])
        if b.curve:
            for i in range(21):
                row = sheet.max_row + 1
                rounds = f"IF(A{row}=1,$B${g}+1,(1-A{row}^($B${g}+1))/(1-A{row}))"
                sheet.append([i / 20, f"={rounds}*$B${tp}/($B${tv}+$B${g}*$B${td})"])
        sheet.append([])
