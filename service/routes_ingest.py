"""POST /v1/ingest, GET /healthz, GET /readyz, GET /metrics."""

from __future__ import annotations

import asyncio
import logging

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy.exc import SQLAlchemyError
from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect

from specwatch.collector.db import is_current
from specwatch.collector.ingest.parse import BatchRejected, gunzip, media_type
from specwatch.collector.ingest.store import IngestCounts
from specwatch.collector.settings import Settings
from specwatch.common.bodies import TooLarge, read_capped
from specwatch.service.deps import DbDep, IngestGrantDep, MetricsDep, SettingsDep, json_response, metrics_access

router = APIRouter()
log = logging.getLogger("specwatch.collector")
_CLOSE = {"connection": "close"}  # the rest of the body never arrived: no next request on this connection


@router.post("/v1/ingest")
async def ingest(request: Request, settings: SettingsDep, metrics: MetricsDep, grant: IngestGrantDep) -> Response:
    """Store one batch atomically; duplicates (by idempotency key) are skipped and counted.
    A tenant-bound token writes its own instances only (403), its requests tagged with its tenant."""
    try:
        body = await read_json_body(request, settings)
        result = await request.app.state.ingest.ingest(body, grant)  # in a worker process (see collector.ingest.parse)
    except BatchRejected as exc:
        metrics.record_rejected(exc.reason)
        raise HTTPException(exc.status, exc.detail, headers=_CLOSE if exc.status == 408 else None) from None
    metrics.record_batch(result.counts, result.new_requests)
    return json_response(_summary(result.counts))


async def read_json_body(request: Request, settings: Settings) -> bytes:
    """The batch's JSON (an ingest batch, or captures): headers checked (415), read whole within the body
    timeout, gzip inflated (in a thread)."""
    gzipped = _is_gzip(request.headers)
    body = await _read_body(request, settings)
    return await asyncio.to_thread(gunzip, body, settings.max_body_bytes) if gzipped else body


def _is_gzip(headers: Headers) -> bool:
    """415 unless the body is JSON: a form or text/plain POST needs no CORS preflight, so any web page
    an operator opens could send one. True when it is gzip-encoded (415 for other encodings)."""
    if media_type(headers.get("content-type", "")) != "application/json":
        given = headers.get("content-type", "none")
        raise _unsupported(f"Content-Type must be application/json (charset utf-8), not {given!r}")
    encoding = headers.get("content-encoding", "identity").strip().lower()
    if encoding not in ("identity", "gzip"):
        raise _unsupported(f"Content-Encoding must be gzip or absent, not {encoding!r}")
    return encoding == "gzip"


def _unsupported(message: str) -> BatchRejected:
    return BatchRejected(415, "unsupported_media_type", {"error": "unsupported_media_type", "message": message})


async def _read_body(request: Request, settings: Settings) -> bytes:
    """408 unless the whole body arrives within `body_timeout_s` (a client stalling mid-body would
    hold its connection open); a client that leaves mid-body is one log line."""
    try:
        async with asyncio.timeout(settings.body_timeout_s):
            return await _read_capped(request, settings.max_body_bytes)
    except TimeoutError:
        message = f"the request body did not arrive within {settings.body_timeout_s:g} s"
        raise BatchRejected(408, "body_timeout", {"error": "body_timeout", "message": message}) from None
    except ClientDisconnect:
        client = f"{request.client.host}:{request.client.port}" if request.client else "a client"
        log.warning("ingest: %s disconnected before sending the whole body; nothing stored", client)
        raise BatchRejected(400, "client_disconnected", {"error": "client_disconnected"}) from None


async def _read_capped(request: Request, limit: int) -> bytes:
    too_large = BatchRejected(413, "too_large", {"error": "too_large", "limit_bytes": limit})
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    try:
        return await read_capped(request.stream(), limit)
    except TooLarge:
        raise too_large from None


def _summary(c: IngestCounts) -> dict:
    return {
        "accepted": c.accepted,
        "duplicates": c.duplicates,
        "requests": {"accepted": c.requests, "duplicates": c.request_duplicates},
        "samples": {"accepted": c.samples, "duplicates": c.sample_duplicates},
        "events": {"accepted": c.events, "duplicates": c.event_duplicates},
        "conflicts": {"count": c.conflicts, "request_ids": list(c.conflict_ids)},
    }


@router.get("/healthz")
async def healthz() -> dict:
    return {"status": "ok"}


@router.get("/readyz")
def readyz(request: Request, db: DbDep) -> Response:
    """Ready when the database answers, its schema is at the newest migration, and it takes writes
    (503 once an ingest write failed and a probe write fails too; see collector.ingest.store.WriteHealth).
    Also says whether this replica is the leader (runs the background work; see collector.leader)."""
    try:
        current = is_current(db)
    except SQLAlchemyError as exc:
        return json_response({"status": "unavailable", "reason": type(exc).__name__}, status=503)
    if not current:
        return json_response({"status": "unavailable", "reason": "schema not migrated"}, status=503)
    problem = request.app.state.store.health.problem()
    if problem is not None:
        return json_response({"status": "unavailable", "reason": f"the store cannot write: {problem}"}, status=503)
    leadership = request.app.state.leadership
    return json_response({"status": "ready", "leader": leadership.is_leader, "replica": leadership.replica_id})


@router.get("/metrics", dependencies=[Depends(metrics_access)])
def metrics_endpoint(metrics: MetricsDep) -> Response:
    return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)
