"""Typed FastAPI dependencies: what the lifespan put on `app.state`, and the ingest token check.

All `async`: FastAPI runs a sync dependency in its thread pool, a hop per dependency per request."""

from __future__ import annotations

import hmac
from typing import Annotated

import orjson
from fastapi import Depends, HTTPException, Request, Response
from sqlalchemy import Engine

from collector.metrics import CollectorMetrics
from collector.settings import Settings


async def get_settings(request: Request) -> Settings:
    return request.app.state.settings


async def get_engine(request: Request) -> Engine:
    return request.app.state.store.engine


async def get_metrics(request: Request) -> CollectorMetrics:
    return request.app.state.metrics


def json_response(data: object, status: int = 200) -> Response:
    """A JSON response serialised by orjson (dataclasses and numpy scalars included)."""
    return Response(
        orjson.dumps(data, option=orjson.OPT_SERIALIZE_NUMPY), status_code=status, media_type="application/json"
    )


SettingsDep = Annotated[Settings, Depends(get_settings)]
EngineDep = Annotated[Engine, Depends(get_engine)]
MetricsDep = Annotated[CollectorMetrics, Depends(get_metrics)]


async def require_ingest_token(request: Request, settings: SettingsDep, metrics: MetricsDep) -> None:
    """401 unless `Authorization: Bearer <SPECWATCH_INGEST_TOKEN>` (when a token is configured)."""
    if not settings.ingest_token:
        return
    scheme, _, given = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not hmac.compare_digest(given.strip().encode(), settings.ingest_token.encode()):
        metrics.record_rejected("unauthorized")
        raise HTTPException(401, {"error": "unauthorized"}, headers={"WWW-Authenticate": "Bearer"})
