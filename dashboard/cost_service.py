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


def _arms(arms: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "arm": a["key"],
                "$ / 1M tokens": a["total_usd_per_mtok"],
                "compute $": a["compute_usd_per_mtok"],
                "energy $": a["energy_usd_per_mtok"],
                "energy source": a["energy_source"],
                "energy added": a["energy_added"],
                "retries $": a["retries_usd_per_mtok"],
                "idle $ (by share)": a["idle_usd_per_mtok"],
                "GPU-hours / 1M tokens": a["gpu_hours_per_mtok"],
                "device time from": a["device_s_source"],
                "memory share": a["memory_share"],
                "monthly $": a["monthly_usd"],
            }
            for a in arms
        ]
    )


def _benefits(benefits: list[dict]) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "drafter arm": b["key"],
                "explicit saving $/month": b["explicit_saving_usd"],
                "draft training $/month": b["hidden"]["draft_training_usd"],
                "monitoring $/month": b["hidden"]["monitoring_usd"],
                "incidents $/month": b["hidden"]["incidents_usd"],
                "opportunity $/month": b["hidden"]["opportunity_usd"],
                "tech-debt reserve $/month": b["hidden"]["tech_debt_usd"],
                "net $/month": b["net_usd"],
                "estimated from": ", ".join(b["estimated_from"]),
                "payback (months)": b["payback_months"],
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
    rows = [{"input": a["name"], "value": a["value"], "unit": a["unit"], "source": a["source"]} for a in assumptions]
    return pd.DataFrame(rows).astype({"value": str}, errors="ignore")


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
