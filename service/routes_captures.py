"""POST /v1/captures (producers, the `ingest` role) and GET /v1/captures (the `admin` role only).

Captures are users' text (telemetry.capture; issue 56): no `read` token reads them, and an admin token
bound to a tenant reads that tenant's only (403 when it asks for another). A tenant-bound ingest token
writes captures of its own instances only, under its tenant (ids scoped `tenant:id`), as for records.
"""

from __future__ import annotations

import asyncio
from functools import partial
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query, Request, Response
from pydantic import ValidationError

from specwatch.collector.captures import EXPORT_PAGE, CaptureFilter, read_captures, scoped, store_captures
from specwatch.collector.ingest.parse import BatchRejected
from specwatch.collector.settings import Settings
from specwatch.common.auth import Grant
from specwatch.service.deps import DbDep, IngestGrantDep, SettingsDep, json_response, require
from specwatch.service.routes_ingest import read_json_body
from specwatch.telemetry.capture import DAY_S, Capture, CaptureBatch, Redactor

router = APIRouter(prefix="/v1")
capture_admin = require("admin")  # tenant-bound admin tokens allowed: scoped to their tenant below
AdminGrantDep = Annotated[Grant | None, Depends(capture_admin)]


@router.post("/captures")
async def post_captures(request: Request, settings: SettingsDep, grant: IngestGrantDep) -> Response:
    """Store a batch of captures: {stored, duplicates, over_cap}; 422 naming the first bad field."""
    try:
        body = await read_json_body(request, settings)
    except BatchRejected as exc:
        raise HTTPException(exc.status, exc.detail) from None
    captures = _own(_parsed(body), grant)
    store = request.app.state.store
    work = partial(
        store_captures,
        store.db,
        captures,
        max_total_chars=settings.capture_max_total_chars,
        retention_s=settings.capture_retention_days * DAY_S,
        redact=_redactor(request, settings),
        lock=store.write_lock(),
    )
    counts = await asyncio.to_thread(work)
    return json_response({"stored": counts.stored, "duplicates": counts.duplicates, "over_cap": counts.over_cap})


def _parsed(body: bytes) -> list[Capture]:
    try:
        return list(CaptureBatch.model_validate_json(body).captures)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "body"
        raise HTTPException(422, {"error": "invalid_capture", "message": f"{where}: {first['msg']}"}) from None


def _own(captures: list[Capture], grant: Grant | None) -> list[Capture]:
    """A tenant-bound token's captures: its own instances only (403), under its tenant."""
    if grant is None or grant.tenant is None:
        return captures
    for index, capture in enumerate(captures):
        if capture.instance not in grant.instances:
            message = f"captures[{index}].instance {capture.instance[:64]!r} is not bound to this token's tenant"
            raise HTTPException(403, {"error": "forbidden", "message": message})
    return [scoped(capture, grant.tenant) for capture in captures]


def _redactor(request: Request, settings: Settings) -> Redactor | None:
    """The collector's own redaction (SPECWATCH_CAPTURE_REDACT), compiled once per app."""
    if not settings.capture_redact:
        return None
    if getattr(request.app.state, "capture_redactor", None) is None:
        request.app.state.capture_redactor = Redactor.of(settings.capture_redact)
    return request.app.state.capture_redactor


def capture_filter(
    tenant: Annotated[str | None, Query(max_length=128)] = None,
    scenario: Annotated[str | None, Query(max_length=128)] = None,
    drafter: Annotated[str | None, Query(max_length=256)] = None,
    model: Annotated[str | None, Query(max_length=128)] = None,
    below_acceptance: Annotated[float | None, Query(gt=0, le=1)] = None,
    prompt_tokens: Annotated[str | None, Query(pattern=r"^\d{1,9}-\d{1,9}$")] = None,
    series_tag: Annotated[str | None, Query(max_length=128)] = None,
    tag_keys: Annotated[str, Query(max_length=256)] = "scenario,tenant",
    after_id: Annotated[int, Query(ge=0)] = 0,
    limit: Annotated[int, Query(ge=1, le=EXPORT_PAGE)] = EXPORT_PAGE,
) -> CaptureFilter:
    band = tuple(int(v) for v in prompt_tokens.split("-")) if prompt_tokens else None
    if band is not None and band[0] > band[1]:
        raise HTTPException(422, {"error": "invalid_band", "message": "prompt_tokens must be LO-HI with LO <= HI"})
    keys = tuple(k for k in tag_keys.split(",") if k)
    return CaptureFilter(tenant, scenario, drafter, model, below_acceptance, band, series_tag, keys, after_id, limit)


@router.get("/captures")
def get_captures(db: DbDep, grant: AdminGrantDep, where: Annotated[CaptureFilter, Depends(capture_filter)]) -> Response:
    """One page of captures: {captures: [...], next_after_id} (null on the last page)."""
    if grant is not None and grant.tenant is not None:
        if where.tenant not in (None, grant.tenant):
            message = f"this token is bound to tenant {grant.tenant!r}; it cannot read tenant {where.tenant!r}"
            raise HTTPException(403, {"error": "forbidden", "message": message})
        where = CaptureFilter(**{**where.__dict__, "tenant": grant.tenant})
    captures, next_after = read_captures(db, where)
    return json_response({"captures": captures, "next_after_id": next_after})
