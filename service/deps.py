"""Typed FastAPI dependencies: what the lifespan put on `app.state`, and access control (`require`).

All `async`: FastAPI runs a sync dependency in its thread pool, a hop per dependency per request."""

from __future__ import annotations

from typing import Annotated

import orjson
from fastapi import Depends, HTTPException, Request, Response
from sqlalchemy import Engine

from specwatch.collector.metrics import CollectorMetrics
from specwatch.collector.settings import Settings
from specwatch.common.auth import Grant, TokenTable


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_db(request: Request) -> Engine:
    return request.app.state.store.db


async def get_metrics(request: Request) -> CollectorMetrics:
    return request.app.state.metrics


def json_response(data: object, status: int = 200) -> Response:
    """A JSON response serialised by orjson (dataclasses and numpy scalars included)."""
    return Response(
        orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY), status_code=status, media_type="application/json"
    )


SettingsDep = Annotated[Settings, Depends(get_settings)]
DbDep = Annotated[Engine, Depends(get_db)]
MetricsDep = Annotated[CollectorMetrics, Depends(get_metrics)]


def require(role: str, *, tenant_scoped: bool = True):
    """A dependency: with any token configured, the request's bearer token must hold `role` (401 for a
    missing or unknown token, 403 for another role's). It returns the token's Grant (None: no tokens, all
    open). `tenant_scoped=False` marks data that cannot be narrowed to one tenant: 403 for a tenant-bound token."""

    async def check(request: Request) -> Grant | None:
        tokens: TokenTable = request.app.state.tokens
        if not tokens.enabled:
            return None
        grant = tokens.grant(request.headers.get("authorization"))
        if grant is None or not grant.allows(role):
            _refuse(request, role, grant)
        if grant.tenant is not None and not tenant_scoped:
            message = f"this token is bound to tenant {grant.tenant!r}; {request.url.path} cannot be scoped to a tenant"
            raise HTTPException(403, {"error": "forbidden", "message": message})
        return grant

    return check


def _refuse(request: Request, role: str, grant: Grant | None) -> None:
    reason = "unauthorized" if grant is None else "forbidden"
    if role == "ingest":
        request.app.state.metrics.record_rejected(reason)
    if grant is None:
        message = f"this endpoint needs a bearer token with the {role!r} role (Authorization: Bearer <token>)"
        raise HTTPException(401, {"error": reason, "message": message}, headers={"WWW-Authenticate": "Bearer"})
    raise HTTPException(403, {"error": reason, "message": f"this token does not hold the {role!r} role"})


# One instance per kind, so FastAPI runs each check once per request however many places name it.
ingest_access = require("ingest")
read_access = require("read")
read_all_tenants = require("read", tenant_scoped=False)
admin_access = require("admin", tenant_scoped=False)
IngestGrantDep = Annotated[Grant | None, Depends(ingest_access)]
ReadGrantDep = Annotated[Grant | None, Depends(read_access)]


async def metrics_access(request: Request, settings: SettingsDep) -> None:
    """/metrics needs a read token like the API, unless SPECWATCH_METRICS_PUBLIC=true."""
    if not settings.metrics_public:
        await read_all_tenants(request)
