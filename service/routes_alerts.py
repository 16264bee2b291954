"""GET /v1/alerts (pending and firing alerts, rule health) and /v1/alerts/history."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response

from alerts.store import active_alerts, history
from service.deps import EngineDep, json_response
from service.routes_query import WindowDep

router = APIRouter(prefix="/v1/alerts")


@router.get("")
def get_alerts(engine: EngineDep, include_resolved: bool = False) -> Response:
    alerts, rules = active_alerts(engine, include_resolved)
    return json_response({"alerts": alerts, "rules": rules})


@router.get("/history")
def get_history(engine: EngineDep, window: WindowDep, limit: Annotated[int, Query(ge=1, le=10_000)] = 1000) -> Response:
    """Alert transitions, remediation actions and webhook notifications in the window, newest first."""
    return json_response(history(engine, window, limit))
