"""The Cost page's reads: the collector's cost model (`GET /v1/cost`) as tables, the daily series
and the monthly report. No Streamlit here (pages cache these through `dashboard.reads`)."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from specwatch.dashboard.api import View, get, get_bytes


@dataclass(frozen=True)
class CostModel:
    """The cost model over a window: `summary` is the collector's answer as it came, the rest its tables."""

    summary: dict
    arms: pd.DataFrame
    benefits: pd.DataFrame
    curves: pd.DataFrame
    tornado: pd.DataFrame
    advice: pd.DataFrame
    assumptions: pd.DataFrame
    concurrency: pd.DataFrame
    crossover: int | None


@dataclass(frozen=True)
class DailyCost:
    """$ per 1M output tokens per UTC day and arm: `rows` (a `time` column for charts), the GPU priced,
    and one note per arm whose figures are estimates."""

    gpu_type: str
    gpu_type_source: str
    rows: pd.DataFrame
    notes: tuple[str, ...]


def cost(view: View, gpu_type: str | None = None, overrides: tuple[tuple[str, float], ...] = ()) -> CostModel:
    """The cost model over the window (`GET /v1/cost`) with what-if inputs, as tables for the Cost page."""
    params = view.params() | ({"gpu_type": gpu_type} if gpu_type else {}) | dict(overrides)
    found = get("/v1/cost", params)
    concurrency = found.get("concurrency") or {"rows": [], "crossover": None}
    return CostModel(
        summary=found,
        arms=_arms(found["tco"]["arms"]),
        benefits=_benefits(found["tco"]["benefits"]),
        curves=_curves(found["break_even"]),
        tornado=pd.DataFrame(found["sensitivity"]),
        advice=pd.DataFrame(found["advice"]),
        assumptions=_assumptions(found["tco"]["assumptions"]),
        concurrency=pd.DataFrame(concurrency["rows"]),
        crossover=concurrency["crossover"],
    )


# a bill line's kind as the stacked bar names it (an arm's line is named by its arm)
BILL_PARTS = {"outside_view": "outside this view", "other_tenants": "other tenants"}


@dataclass(frozen=True)
class WindowBill:
    """The window's bill (Σ instance bills) and what makes it up: `parts` (part, usd, estimate), Σ = the bill."""

    usd: float
    parts: pd.DataFrame
    estimate: bool  # some instance priced as the inputs' GPU type, or a line rests on derived device time


def window_bill(summary: dict) -> WindowBill | None:
    """The bill of the cost model's allocation (None: nothing billed in the window)."""
    allocation = summary["tco"].get("allocation") or {}
    bills, lines = allocation.get("bills") or [], allocation.get("lines") or []
    if not bills:
        return None
    parts: dict[str, list] = {}
    for line in lines:
        name = f"arm {line['arm']}" if line["kind"] == "arm" else BILL_PARTS.get(line["kind"], line["kind"])
        usd, estimate = parts.get(name, [0.0, False])
        parts[name] = [usd + line["compute_usd"] + line["energy_usd"], estimate or line["estimate"]]
    frame = pd.DataFrame([(k, usd, est) for k, (usd, est) in parts.items()], columns=["part", "usd", "estimate"])
    total = sum(b["compute_usd"] + b["energy_usd"] for b in bills)
    estimate = any(b["source"].startswith("estimate") for b in bills) or bool(frame["estimate"].any())
    return WindowBill(total, frame, estimate)


def _arms(arms: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "arm": a["key"],
                "$ / 1M tokens": a["total_usd_per_mtok"],
                "monthly $": a["monthly_usd"],
                "compute $": a["compute_usd_per_mtok"],
                "energy $": a["energy_usd_per_mtok"],
                "energy source": a["energy_source"],
                "energy added": a["energy_added"],
                "retries $": a["retries_usd_per_mtok"],
                "idle $ (by share)": a["idle_usd_per_mtok"],
                "GPU-hours / 1M tokens": a["gpu_hours_per_mtok"],
                "device time from": a["device_s_source"],
                "memory share": a["memory_share"],
            }
            for a in arms
        ]
    )


def _benefits(benefits: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "drafter arm": b["key"],
                "net $/month": b["net_usd"],
                "payback (months)": b["payback_months"],
                "explicit saving $/month": b["explicit_saving_usd"],
                "draft training $/month": b["hidden"]["draft_training_usd"],
                "monitoring $/month": b["hidden"]["monitoring_usd"],
                "incidents $/month": b["hidden"]["incidents_usd"],
                "opportunity $/month": b["hidden"]["opportunity_usd"],
                "tech-debt reserve $/month": b["hidden"]["tech_debt_usd"],
                "estimated from": ", ".join(b["estimated_from"]),
            }
            for b in benefits
        ]
    )


def _curves(break_even: list[dict]) -> pd.DataFrame:
    """Modelled speed-up and net benefit against acceptance, per arm (the columns even when empty)."""
    rows = [(b["key"], *point) for b in break_even for point in b["curve"]]
    return pd.DataFrame(rows, columns=["arm", "acceptance", "speed-up", "net $/month"])


def step_times(b: dict) -> str:
    """The break-even's inputs in ms, and the step-cost curve's points they were read from (when any)."""
    ms = ["n/a" if b.get(k) is None else f"{1000 * b[k]:.2f}" for k in ("t_plain_s", "t_verify_s", "t_draft_s")]
    line = f"t_plain {ms[0]} ms, t_verify {ms[1]} ms, t_draft {ms[2]} ms per drafted token"
    points = ", ".join(f"{p['rows']:g} rows {1000 * p['seconds']:.2f} ms" for p in b.get("step_points") or ())
    return f"{line}; curve at batch {b.get('batch')}: {points}" if points else line


def _assumptions(assumptions: list[dict]) -> pd.DataFrame:
    rows = [(a["name"], _figure(a["value"]), a["unit"], a["source"]) for a in assumptions]
    return pd.DataFrame(rows, columns=["input", "value", "unit", "source"])


def _figure(value: object) -> str:
    """75429713.06 -> "75,429,713"; 0.0123 -> "0.0123"; text as it is (one column holds both)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return str(value)
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:,.4g}"


def cost_daily(days: int) -> DailyCost:
    """$ per 1M output tokens per UTC day and arm over the last `days` (`GET /v1/cost/daily`); a note
    per arm whose figures are estimates, saying what was estimated and on how many days."""
    found = get("/v1/cost/daily", {"days": days})
    frame = pd.DataFrame(found["rows"])
    notes = []
    if not frame.empty:
        frame["time"] = pd.to_datetime(frame["start"], unit="s", utc=True)
        frame["estimated"] = frame["estimated"].map(", ".join)
        for (arm, what), group in frame[frame["estimate"]].groupby(["arm", "estimated"]):
            notes.append(f"{arm}: {what} on {len(group)} of {int((frame['arm'] == arm).sum())} days")
    return DailyCost(found["gpu_type"], found["gpu_type_source"], frame, tuple(notes))


def report_html(month: str) -> bytes:
    """A month's self-contained HTML cost-benefit report, built by the collector."""
    return get_bytes("/v1/report", {"month": month}, role="admin", timeout_s=120.0)
