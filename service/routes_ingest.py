"""POST /v1/ingest, GET /healthz, GET /readyz, GET /metrics."""

from __future__ import annotations

from fastapi import APIRouter, Depends, HTTPException, Request
from fastapi.responses import Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy.exc import SQLAlchemyError

from collector.db import is_current
from collector.ingest import BatchRejected
from collector.store import IngestCounts
from service.deps import EngineDep, MetricsDep, SettingsDep, json_response, require_ingest_token

router = APIRouter()


@router.post("/v1/ingest", dependencies=[Depends(require_ingest_token)])
async def ingest(request: Request, settings: SettingsDep, metrics: MetricsDep) -> Response:
    """Store one batch atomically; duplicates (by idempotency key) are skipped and counted."""
    try:
        body = await _read_body(request, settings.max_body_bytes)
        result = await request.app.state.ingest.ingest(body)  # in a worker process (see collector.ingest)
    except BatchRejected as exc:
        metrics.record_rejected(exc.reason)
        raise HTTPException(exc.status, exc.detail) from None
    metrics.record_batch(result.counts, result.new_requests)
    return json_response(_summary(result.counts))


async def _read_body(request: Request, limit: int) -> bytes:
    too_large = BatchRejected(413, "too_large", {"error": "too_large", "limit_bytes": limit})
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > limit:
        raise too_large
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large
        chunks.append(chunk)
    return b"".join(chunks)


def _summary(c: IngestCounts) -> dict:
    return {
        "accepted": c.accepted,
        "duplicates": c.duplicates,
        "requests": {"accepted": c.requests, "duplicates": c.request_duplicates},
        "samples": {"accepted": c.samples, "duplicates": c.sample_duplicates},
        "events": {"accepted": c.events, "duplicates": c.event_duplicates},
    }


@router.get("/healthz")
async def healthz() -> dict:
    return {"status": "ok"}


@router.get("/readyz")
def readyz(engine: EngineDep) -> Response:
    """Ready when the database answers and its schema is at the newest migration."""
    try:
        current = is_current(engine)
    except SQLAlchemyError as exc:
        return json_response({"status": "unavailable", "reason": type(exc).__name__}, status=503)
    if not current:
        return json_response({"status": "unavailable", "reason": "schema not migrated"}, status=503)
    return json_response({"status": "ready"})


@router.get("/metrics")
def metrics_endpoint(metrics: MetricsDep) -> Response:
    return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)
