"""POST /v1/traces: OTLP/HTTP trace export (protobuf or JSON), vLLM's llm_request spans stored as
request records through the normal ingest path (collector.ingest.otlp says how a span maps to a record).

Guarded like /v1/ingest: the ingest token (a tenant-bound one writes its own instances only), the
same body cap, body timeout and gzip handling; nothing is stored when the body is refused."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, HTTPException, Request
from fastapi.responses import Response

from specwatch.collector.ingest import otlp
from specwatch.collector.ingest.parse import BatchRejected, gunzip
from specwatch.service.deps import IngestGrantDep, MetricsDep, SettingsDep
from specwatch.service.routes_ingest import _read_body

router = APIRouter()


@router.post("/v1/traces")
async def traces(request: Request, settings: SettingsDep, metrics: MetricsDep, grant: IngestGrantDep) -> Response:
    """Answers OTLP's ExportTraceServiceResponse in the request's encoding, with `partial_success`
    counting the llm_request spans that made no valid record; spans of other names are ignored."""
    headers = request.headers
    try:
        media_type, gzipped = otlp.content_kind(headers.get("content-type", ""), headers.get("content-encoding", ""))
        body = await _read_body(request, settings)
        if gzipped:
            body = await asyncio.to_thread(gunzip, body, settings.max_body_bytes)
        result = await asyncio.to_thread(otlp.intake, body, media_type)
        if result.records:
            stored = await request.app.state.ingest.ingest(otlp.batch_body(result.records), grant)
            metrics.record_batch(stored.counts, stored.new_requests)
    except BatchRejected as exc:
        metrics.record_rejected(exc.reason)
        raise HTTPException(
            exc.status, exc.detail, headers={"connection": "close"} if exc.status == 408 else None
        ) from None
    return Response(otlp.response_body(result, media_type), media_type=media_type)
