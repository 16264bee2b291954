"""GET /v1/speculation/activity: is each instance configured to speculate drafting at all?
(`collector.reads.speculation`). Over data that carries no tenant (scrapes, config events): a
tenant-bound token gets 403."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Response

from specwatch.collector.reads.speculation import speculation_activity
from specwatch.service.deps import DbDep, SettingsDep, json_response, read_access, read_all_tenants
from specwatch.service.routes_query import WindowDep

router = APIRouter(prefix="/v1", dependencies=[Depends(read_access)])


@router.get("/speculation/activity", dependencies=[Depends(read_all_tenants)])
def get_activity(
    db: DbDep,
    settings: SettingsDep,
    window: WindowDep,
    min_fraction: Annotated[float | None, Query(ge=0, le=1)] = None,
) -> Response:
    """Per instance configured to speculate: drafts, generated tokens, the drafted step fraction, whether
    that is below `min_fraction` (default SPECWATCH_SPECULATION_MIN_FRACTION) and when it last drafted."""
    threshold = settings.speculation_min_fraction if min_fraction is None else min_fraction
    activities = speculation_activity(db, window, threshold)
    return json_response({"min_fraction": threshold, "window": window, "instances": activities})
