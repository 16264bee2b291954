"""Everything the cost views show, in one object: TCO, break-even, sensitivity and advice.

    measured_summary(db, window, prices, gpu_type=None, overrides=Overrides())   from the store
    summarize(inputs, source="what-if")                                              from given inputs
    render_text(summary)                                                             the CLI's table

`specwatch cost --json` and GET /v1/cost return `CostSummary` as JSON; the monthly report
can call `measured_summary` for its month.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from sqlalchemy import Engine

from specwatch.collector.reads.breakdown import Comparison, compare
from specwatch.collector.reads.queries import Filters, Window
from specwatch.cost.advisor import Recommendation, advise
from specwatch.cost.breakeven import BreakEven, TornadoRow, break_even, sensitivity
from specwatch.cost.concurrency import ConcurrencyCosts, GroupCosts, concurrency_costs
from specwatch.cost.inputs import Overrides, apply_overrides
from specwatch.cost.measured import IncidentHistory, infer_gpu_type, measured_inputs, read_usage
from specwatch.cost.model import CostInputs, HiddenCosts, Prices, Tco, tco
from specwatch.cost.verdict import Verdict, verdict_of

DEFAULT_GPU = "H100-SXM"
MONTH_S = 30 * 86400


@dataclass(frozen=True)
class CostSummary:
    source: str  # measured | what-if
    window: Window | None
    inputs: CostInputs
    tco: Tco
    break_even: tuple[BreakEven, ...]
    sensitivity: tuple[TornadoRow, ...]  # widest swing first
    advice: tuple[Recommendation, ...]
    notes: tuple[str, ...]  # the TCO's notes and how the inputs were chosen
    concurrency: ConcurrencyCosts | None = None  # measured windows: cost per 1M tokens by concurrency level
    verdict: Verdict | None = None  # the one answer every view states (cost.verdict)


def summarize(
    inputs: CostInputs,
    *,
    source: str = "what-if",
    window: Window | None = None,
    advice: tuple[Recommendation, ...] = (),
    notes: tuple[str, ...] = (),
    spread: float = 0.2,
    concurrency: ConcurrencyCosts | None = None,
    comparison: Comparison | None = None,
) -> CostSummary:
    costs = tco(inputs)
    main = concurrency.main if concurrency else None
    judged = verdict_of(costs, comparison, main.crossover if main else None)
    return CostSummary(
        source,
        window,
        inputs,
        costs,
        break_even(inputs),
        tuple(sensitivity(inputs, spread)),
        tuple(priced_advice(advice, judged)),
        tuple(notes) + costs.notes,
        concurrency,
        judged,
    )


def priced_advice(advice, judged: Verdict) -> list[Recommendation]:
    """The advisor reads cost: no ENABLE for the judged drafter while it costs more per token at the
    load served; a canary proves the latency gain against its price instead."""
    if judged.paying is not False:
        return list(advice)
    loss = judged.spec_usd_per_mtok - judged.plain_usd_per_mtok
    why = f"speculation costs ${loss:.4f} more per 1M tokens than plain decoding at the load served (the verdict)"
    return [
        replace(r, action="canary", rule="costs_more_per_token", reason=f"{r.reason}; but {why}")
        if r.action == "enable"
        else r
        for r in advice
    ]


def measured_summary(
    db: Engine,
    window: Window,
    prices: Prices,
    *,
    gpu_type: str | None = None,
    overrides: Overrides = Overrides(),
    filters: Filters = Filters(),
    hidden: HiddenCosts = HiddenCosts(),
    incidents: IncidentHistory | None = None,
) -> CostSummary:
    """Measure the window, price every instance on `gpu_type` (or `overrides.gpu_type`) when given, else
    each on its own device (`overrides.fleet`, its device samples; the most sampled device, else H100-SXM,
    where nothing names one), apply the overrides and advise per scenario. ValueError on an unknown GPU or
    a bad override."""
    notes = []
    forced = gpu_type or overrides.gpu_type
    gpu = forced or infer_gpu_type(db, window, prices)
    if gpu is None:
        gpu = DEFAULT_GPU
        notes.append(f"gpu_type {gpu} assumed: no device sample in the window names a GPU of the price table")
    usage = read_usage(db, window, filters)
    measured = measured_inputs(
        db,
        window,
        prices,
        gpu_type=gpu,
        filters=filters,
        hidden=hidden,
        incidents=incidents,
        usage=usage,
        fleet=overrides.fleet,
        per_instance=forced is None,
    )
    inputs = apply_overrides(measured, overrides)
    advice = advise(db, window, inputs.device_memory_bytes, inputs.gpu_count, filters=filters)
    by_level = concurrency_costs(db, window, inputs, filters=filters, usage=usage)
    return summarize(
        inputs,
        source="measured",
        window=window,
        advice=tuple(advice),
        notes=tuple(notes),
        concurrency=by_level,
        comparison=latency_comparison(db, window, filters),
    )


def latency_comparison(db: Engine, window: Window, filters: Filters = Filters()) -> Comparison:
    """The A/B arms' per-request comparison, else all requests by mode (biased)."""
    by_arm = compare(db, window, filters, by="arm")
    return by_arm if by_arm.speedup is not None else compare(db, window, filters, by="mode")


# --- text -----------------------------------------------------------------------------------


def _usd(value: float | None, digits: int = 2) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def _num(value: float | None, fmt: str = ".3f") -> str:
    return "n/a" if value is None else format(value, fmt)


def render_text(summary: CostSummary) -> str:
    notes = ["", "Notes:", *(f"  - {n}" for n in summary.notes)] if summary.notes else []
    verdict = [f"Verdict: {summary.verdict.sentence}", ""] if summary.verdict else []
    return "\n".join(
        [
            *verdict,
            *_header(summary),
            "",
            *_arm_table(summary.tco),
            "",
            *_benefits(summary.tco),
            *_concurrency_lines(summary.concurrency),
            *_break_even_lines(summary.break_even),
            *_tornado_lines(summary.sensitivity),
            *_advice_lines(summary.advice),
            *_assumption_lines(summary.tco),
            *notes,
        ]
    )


def _header(summary: CostSummary) -> list[str]:
    t = summary.tco
    where = "what-if inputs" if summary.window is None else f"last {_span(summary.window.seconds)} measured"
    return [
        f"Cost of speculative decoding ({where}); {_devices(t)}, prices as of {t.prices_as_of}",
        f"Volume priced: {t.monthly_output_tokens:,.0f} output tokens/month ({t.volume_source})",
    ]


def _devices(t: Tco) -> str:
    """The device(s) priced: one GPU type, or each instance's own (a mixed fleet)."""
    bills = t.allocation.bills if t.allocation else ()
    priced = sorted({(b.gpu_type, b.gpu_hour_usd, b.pricing) for b in bills if b.gpu_type})
    if len(priced) <= 1:
        return f"{t.gpu_type} at ${t.gpu_hour_usd:.2f}/GPU-hour ({t.pricing})"
    each = ", ".join(
        f"{b.instance} {b.gpu_count}x {b.gpu_type} at ${b.gpu_hour_usd:.2f}/GPU-hour ({b.pricing})" for b in bills
    )
    return f"each instance on its own device: {each}"


def _arm_table(t: Tco) -> list[str]:
    if not t.arms:
        return ["No requests to price in this window."]
    rows = [
        ("USD per 1M output tokens", [("~" if a.estimate else "") + a.key for a in t.arms]),
        ("memory share", [_num(a.memory_share) for a in t.arms]),
        ("GPU-hours (device time)", [_num(a.gpu_hours_per_mtok, ".4g") for a in t.arms]),
        ("  device time from", [a.device_s_source for a in t.arms]),
        ("compute", [_usd(a.compute_usd_per_mtok, 4) for a in t.arms]),
        (
            "energy" if t.pricing == "on-prem" else "energy (in the price)",
            [_usd(a.energy_usd_per_mtok, 4) for a in t.arms],
        ),
        ("  energy source", [a.energy_source or "not measured" for a in t.arms]),
        ("retries (failed work)", [_usd(a.retries_usd_per_mtok, 4) for a in t.arms]),
        ("idle (charged to the arm)", [_usd(a.idle_usd_per_mtok, 4) for a in t.arms]),
        ("total", [_usd(a.total_usd_per_mtok, 4) for a in t.arms]),
        ("monthly USD at the volume", [_usd(a.monthly_usd, 0) for a in t.arms]),
    ]
    widths = [max(len(r[1][i]) for r in rows) + 2 for i in range(len(t.arms))]
    table = [f"{label:<28}" + "".join(f"{cell:>{w}}" for cell, w in zip(cells, widths)) for label, cells in rows]
    return table + _idle_lines(t) + bill_lines(t)


def _idle_lines(t: Tco) -> list[str]:
    if t.idle is None:
        return ["idle device time: not measured (no device samples)"]
    i = t.idle
    how = (
        "its own line, not in the arms above" if i.allocation == "separate" else f"charged to the arms ({i.allocation})"
    )
    return [
        f"idle device time: {i.idle_fraction:.0%} of {i.up_s:,.0f} s up; {_usd(i.monthly_usd, 0)} USD/month ({how})"
    ]


def bill_lines(t: Tco) -> list[str]:
    """The window's bill and the lines that make it up (Σ lines = the bill)."""
    a = t.allocation
    if a is None or not a.bills:
        return []
    parts = ", ".join(f"{kind} {_usd(usd, 4)}" for kind, usd in sorted(a.by_kind().items()))
    return [f"bill for the window: {_usd(a.bill_usd, 4)} USD = {parts} (idle: {a.method})"]


def _benefits(t: Tco) -> list[str]:
    lines = []
    for b in t.benefits:
        h = b.hidden
        payback = "never" if b.payback_months is None else f"{b.payback_months:.1f} months"
        primary = " (primary)" if b.key == t.primary else ""
        lines += [
            f"{b.key}{primary}: saves {_usd(b.explicit_saving_usd, 0)} USD/month explicit",
            (
                f"  hidden USD/month: draft training {_usd(h.draft_training_usd, 0)},"
                f" monitoring {_usd(h.monitoring_usd, 0)}"
                f" ({h.monitoring_source}), incidents {_usd(h.incidents_usd, 0)} ({h.incidents_source}),"
                f" opportunity {_usd(h.opportunity_usd, 0)}, tech-debt reserve {_usd(h.tech_debt_usd, 0)}"
                f" = {_usd(h.total_usd, 0)}"
            ),
            f"  net benefit {estimate_mark(b)}{_usd(b.net_usd, 0)} USD/month with the reserve"
            f" (on {h.reserve_base}: {_usd(h.reserve_base_usd, 0)} base),"
            f" {estimate_mark(b)}{_usd(b.net_without_reserve_usd, 0)} without; draft training pays back: {payback}",
        ]
        if b.estimated_from:
            lines.append(f"  ~ estimated from: {', '.join(b.estimated_from)}")
    return lines or ["No plain-decoding arm to compare against: no benefit computed."]


def estimate_mark(benefit) -> str:
    """ "~" before a figure that rests on estimates or seed defaults (see Benefit.estimated_from)."""
    return "~" if benefit.estimated_from else ""


def _concurrency_lines(by_level: ConcurrencyCosts | None) -> list[str]:
    if by_level is None or not by_level.rows:
        return []
    lines = ["", "USD per 1M output tokens by concurrency (the allocation's $ per device-second; 95% bootstrap):"]
    for row in by_level.rows:
        interval = "" if row.usd_low is None else f" [{_usd(row.usd_low, 4)}, {_usd(row.usd_high, 4)}]"
        small = "" if row.enough else "  (too few requests or tokens: not used)"
        lines.append(
            f"  level {row.level:>3} {row.mode:<15} {row.requests:>8.1f} requests {row.output_tokens:>11,.0f} tokens"
            f"  {row.gpu_hours_per_mtok:>9.4g} GPU-h  {_usd(row.usd_per_mtok, 4):>10} USD{interval}{small}"
        )
    for group in by_level.groups:
        lines += _group_lines(group)
    for mode, level, usd in by_level.best_within_slo:
        lines.append(
            f"  {mode}: {_usd(usd, 4)} USD per 1M tokens at level {level}, the highest meeting the latency rules"
        )
    return lines


def _group_lines(group: GroupCosts) -> list[str]:
    """One drafter on one GPU type: its crossover, and the per-request model beside the measured ratio."""
    who = f"{group.drafter or 'speculation'} on {group.gpu_type}"
    lines = [f"  {who}: {group.crossover.reason}"]
    if group.calibration:
        lines.append(
            f"    {'level':>5} {'measured device ratio':>22} {'model':>7} {'error':>7} {'latency speed-up':>17}"
        )
    for check in group.calibration:
        error = "" if check.error is None else f"{check.error:+.0%}"
        lines.append(
            f"    {check.level:>5} {_num(check.measured_ratio, '.2f'):>21}x {_num(check.model_ratio, '.2f'):>6}x"
            f" {error:>7} {_num(check.latency_speedup, '.2f'):>16}x" + (f"  ({check.why})" if check.why else "")
        )
    return lines


def _assumption_lines(t: Tco) -> list[str]:
    lines = ["", "Assumptions (input, value, source):"] if t.assumptions else []
    for a in t.assumptions:
        value = f"{a.value:,.6g}" if isinstance(a.value, (int, float)) else a.value
        lines.append(f"  {a.name:<44} {value:>14} {a.unit:<32} {a.source}")
    return lines


def _break_even_lines(rows: tuple[BreakEven, ...]) -> list[str]:
    lines = ["", "Break-even (acceptance alpha per drafted token):"] if rows else []
    for b in rows:
        lines.append(
            f"  {b.key}: gamma {_num(b.gamma, '.2f')}, c {_num(b.draft_cost_ratio)},"
            f" verify cost {_num(b.verify_cost_ratio, '.2f')}x a plain step, acceptance rate "
            f"{_num(b.acceptance_rate)}, alpha {_num(b.measured_alpha)};"
            f" speed-up model {_num(b.model_speedup, '.2f')}x,"
            f" measured {_num(b.measured_speedup, '.2f')}x; speed-up 1 at alpha {_num(b.speedup_alpha)},"
            f" net benefit 0 at alpha {_num(b.benefit_alpha)} ({b.source})"
        )
        lines.append(f"    times from {b.times_from or 'n/a'}: {_step_times(b)}")
        lines += [f"    ! {w}" for w in b.warnings]
    return lines


def _step_times(b: BreakEven) -> str:
    ms = [_num(None if t is None else 1000 * t, ".2f") for t in (b.t_plain_s, b.t_verify_s, b.t_draft_s)]
    points = ", ".join(f"{p.rows:g} rows {1000 * p.seconds:.2f} ms (n={p.count})" for p in b.step_points)
    curve = f"; curve at batch {b.batch}: {points}" if b.step_points else ""
    forward = f" per forward of {b.batch}" if b.batch else ""
    draft = f"t_draft {ms[2]} ms per drafted token of one request"
    return f"t_plain {ms[0]} ms, t_verify {ms[1]} ms{forward}, {draft}{curve}"


def _tornado_lines(rows: tuple[TornadoRow, ...], top: int = 8) -> list[str]:
    lines = ["", "Sensitivity: net USD/month with each input -20% / +20%:"] if rows else []
    return lines + [f"  {r.name:<40} {_usd(r.net_at_low, 0):>12} {_usd(r.net_at_high, 0):>12}" for r in rows[:top]]


def _advice_lines(advice: tuple[Recommendation, ...]) -> list[str]:
    lines = ["", "Advice per scenario:"] if advice else []
    for r in advice:
        lines.append(f"  {r.sentence}")
        lines += [f"    ! {c}" for c in r.contradictions]
    return lines


def _span(seconds: float) -> str:
    return f"{seconds / 86400:.1f} days" if seconds >= 86400 else f"{seconds / 3600:.1f} hours"
