"""GET /v1/cost: the cost model over a window of the store (the dashboard's Cost page reads it).

Window: `start` and `end`, or `last` seconds (default 30 days); the usual request filters.
Editable inputs (each optional; out-of-range values are a 422 with a message): `gpu_type`
(or `gpu`; default: the sampled device's price table row, else H100-SXM), `gpu_hour_usd`,
`electricity_usd_per_kwh`, `pue`, `monthly_output_tokens`, `draft_training_usd`,
`training_data_fraction`, `amortisation_months`, `monitoring_retention_days`,
`incident_days_per_week` (or `incidents=alerts`: derived from the alert history),
`opportunity_days_per_month`, `tech_debt_buffer`, `pricing` (on-demand | spot | reserved |
on-prem), `idle_allocation` (separate | weighted | even; by_share = weighted), `reserve_base`
(additions | deployment).

GET /v1/cost/focus (same window, filters and inputs): the bill's lines as FOCUS 1.2 CSV rows
(`cost.focus`), the same rows as `specwatch cost --focus`.

The body is `cost.summary.CostSummary` as JSON: source, window, inputs, tco
(arms, benefits, primary, notes), break_even, sensitivity, advice, notes. Each break_even row says where
its step times came from: `times_from` step_curve (the engine's published curve; `batch`,
`curve_instance` and `step_points` show where on it) | records | not measured (docs/cost.md).

GET /v1/cost/daily?days=N (1 to 90, default 30; anything else is a 400 with a message): the last
N UTC days, each priced on its own, as `service.cost_gauges.DailyCost`: days, gpu_type,
gpu_type_source, rows (day, start, arm, mode, drafter, usd_per_mtok, gpu_hours_per_mtok,
output_tokens, requests, estimate, estimated).
"""

from __future__ import annotations

import io
import re
from dataclasses import replace
from functools import lru_cache
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response

from specwatch.alerts.store import incident_history
from specwatch.collector.reads.queries import Window
from specwatch.cost.focus import measured_focus, write_focus
from specwatch.cost.inputs import Overrides, load_prices
from specwatch.cost.measured import infer_gpu_type
from specwatch.cost.model import Prices
from specwatch.cost.summary import DEFAULT_GPU, MONTH_S, measured_summary
from specwatch.service.cost_gauges import MAX_DAYS, DailyCosts
from specwatch.service.deps import DbDep, json_response, read_all_tenants
from specwatch.service.routes_query import FiltersDep, window_param

router = APIRouter(prefix="/v1", dependencies=[Depends(read_all_tenants)])  # energy is per device
NonNegative = Annotated[float | None, Query(ge=0, allow_inf_nan=False)]


@lru_cache(maxsize=1)
def shipped_prices() -> Prices:
    return load_prices()


def cost_window(
    start: float | None = None,
    end: float | None = None,
    last: Annotated[float, Query(gt=0, allow_inf_nan=False)] = float(MONTH_S),
) -> Window:
    return window_param(start, end, last)


def overrides_param(
    gpu_hour_usd: NonNegative = None,
    electricity_usd_per_kwh: NonNegative = None,
    pue: Annotated[float | None, Query(ge=1, allow_inf_nan=False)] = None,
    monthly_output_tokens: NonNegative = None,
    draft_training_usd: NonNegative = None,
    training_data_fraction: Annotated[float | None, Query(gt=0, le=10, allow_inf_nan=False)] = None,
    amortisation_months: Annotated[float | None, Query(gt=0, allow_inf_nan=False)] = None,
    monitoring_retention_days: NonNegative = None,
    incident_days_per_week: NonNegative = None,
    opportunity_days_per_month: NonNegative = None,
    tech_debt_buffer: Annotated[float | None, Query(ge=0, le=10, allow_inf_nan=False)] = None,
    reserve_base: Literal["additions", "deployment"] | None = None,
    pricing: Literal["on-demand", "spot", "reserved", "on-prem"] | None = None,
    idle_allocation: Literal["separate", "weighted", "even", "by_share"] | None = None,
) -> Overrides:
    return Overrides(**{k: v for k, v in locals().items()})


def gpu_param(gpu: str | None = None, gpu_type: str | None = None) -> str | None:
    if gpu and gpu_type and gpu != gpu_type:
        raise HTTPException(422, {"error": "invalid_parameter", "message": "gpu and gpu_type disagree: give one"})
    return gpu_type or gpu


@router.get("/cost")
def get_cost(
    db: DbDep,
    filters: FiltersDep,
    window: Annotated[Window, Depends(cost_window)],
    overrides: Annotated[Overrides, Depends(overrides_param)],
    gpu_type: Annotated[str | None, Depends(gpu_param)],
    incidents: Literal["seed", "alerts"] = "seed",
) -> Response:
    """TCO per arm, benefit of speculation, break-even acceptance, sensitivity and per-scenario advice."""
    try:
        summary = measured_summary(
            db,
            window,
            shipped_prices(),
            gpu_type=gpu_type,
            overrides=overrides,
            filters=filters,
            incidents=incident_history(db, window) if incidents == "alerts" else None,
        )
    except ValueError as exc:
        raise HTTPException(422, {"error": "invalid_parameter", "message": str(exc)}) from None
    return json_response(summary)


@router.get("/cost/focus")
def get_cost_focus(
    db: DbDep,
    filters: FiltersDep,
    window: Annotated[Window, Depends(cost_window)],
    overrides: Annotated[Overrides, Depends(overrides_param)],
    gpu_type: Annotated[str | None, Depends(gpu_param)],
) -> Response:
    """The window's bill as FinOps FOCUS 1.2 rows (CSV): every line per UTC day, instance and arm."""
    prices = shipped_prices()
    try:
        fallback = infer_gpu_type(db, window, prices) or DEFAULT_GPU  # where no sample or fleet entry names one
        given = replace(overrides, gpu_type=gpu_type) if gpu_type else overrides  # ?gpu=X: every instance as X
        rows = measured_focus(db, window, prices, gpu_type=fallback, overrides=given, filters=filters)
    except ValueError as exc:
        raise HTTPException(422, {"error": "invalid_parameter", "message": str(exc)}) from None
    out = io.StringIO()
    write_focus(rows, out)
    return Response(out.getvalue(), media_type="text/csv")


def days_param(days: str = "30") -> int:
    """A whole number of days in [1, MAX_DAYS], in ASCII digits (str.isdigit takes "²", which int()
    refuses: a 500); anything else is a 400 that says so."""
    if not re.fullmatch(r"[0-9]{1,4}", days) or not 1 <= int(days) <= MAX_DAYS:
        message = f"days must be a whole number from 1 to {MAX_DAYS}, got {days!r}"
        raise HTTPException(400, {"error": "invalid_parameter", "message": message})
    return int(days)


async def get_daily_costs(request: Request) -> DailyCosts:
    return request.app.state.daily_costs


@router.get("/cost/daily")
def get_cost_daily(
    daily: Annotated[DailyCosts, Depends(get_daily_costs)], days: Annotated[int, Depends(days_param)]
) -> Response:
    """$ and GPU-hours per 1M output tokens per UTC day and arm, with output tokens, requests and
    whether the figure is an estimate (past days' figures are kept: see DailyCosts)."""
    return json_response(daily.series(days))
