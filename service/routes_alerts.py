"""GET /v1/alerts (pending and firing alerts, rule health), /v1/alerts/history and /v1/rules."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, Response

from specwatch.alerts.rules import AlertConfig, Rule
from specwatch.alerts.signals import DEFINITIONS, SIGNALS
from specwatch.alerts.store import active_alerts, history
from specwatch.service.deps import DbDep, json_response, read_access, read_all_tenants
from specwatch.service.routes_query import WindowDep

# Alerts span every tenant; the rules are configuration, no tenant's data.
router = APIRouter(prefix="/v1/alerts", dependencies=[Depends(read_all_tenants)])
rules_router = APIRouter(prefix="/v1/rules", dependencies=[Depends(read_access)])


@router.get("")
def get_alerts(db: DbDep, include_resolved: bool = False) -> Response:
    alerts, rules = active_alerts(db, include_resolved)
    return json_response({"alerts": alerts, "rules": rules})


@router.get("/history")
def get_history(db: DbDep, window: WindowDep, limit: Annotated[int, Query(ge=1, le=10_000)] = 1000) -> Response:
    """Alert transitions, remediation actions and webhook notifications in the window, newest first."""
    return json_response(history(db, window, limit))


@rules_router.get("")
def get_rules(request: Request) -> Response:
    """The rules this collector evaluates, as loaded at start-up (none when alerting is off here):
    the one home of every threshold the dashboard draws."""
    config: AlertConfig | None = request.app.state.alert_config
    rules = [] if config is None else [_rule(rule) for rule in config.rules]
    interval = None if config is None else config.evaluation.interval
    return json_response({"enabled": config is not None, "evaluation_interval_s": interval, "rules": rules})


def _rule(rule: Rule) -> dict:
    return {
        "name": rule.name,
        "signal": rule.signal,
        "definition": DEFINITIONS.get(rule.signal),  # the acceptance definition its threshold applies to
        "unit": SIGNALS[rule.signal].unit,
        "op": rule.op,
        "threshold": rule.threshold,
        "window_s": rule.window,
        "for_s": rule.for_,
        "keep_firing_for_s": rule.keep_firing_for,
        "min_samples": rule.min_samples,
        "group_by": list(rule.group_by),
        "labels": {"severity": rule.severity},
        "summary": rule.summary,
        "actions": list(rule.actions),
    }
