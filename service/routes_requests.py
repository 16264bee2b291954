"""GET /v1/requests: the Requests listing (filters, sort, keyset pages) and one request's detail
(`collector.reads.request_reads`). Needs a `read` token when tokens are configured; a tenant-bound token
sees only its tenant's requests (the listing filters on its tag, the detail answers 404 for others).

The listing takes the query API's window and filters (`routes_query`), plus `status`, `flag`
(outlier | repetition | collapse | any), `sort` (time | ttft | e2e | acceptance; rows without that
value are left out), `order` (desc | asc), `limit` (1..500) and `cursor` (the previous page's
`next_cursor`; a cursor of another sort is a 422).
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, HTTPException, Query, Response

from specwatch.collector.ingest.parse import scoped_id
from specwatch.collector.reads import request_reads
from specwatch.collector.reads.request_reads import BadCursor, RequestQuery
from specwatch.service.deps import DbDep, ReadGrantDep, json_response, read_access
from specwatch.service.routes_query import FiltersDep, WindowDep

router = APIRouter(prefix="/v1", dependencies=[Depends(read_access)])


def query_param(
    sort: Literal["time", "ttft", "e2e", "acceptance"] = "time",
    order: Literal["desc", "asc"] = "desc",
    status: Literal["ok", "error", "cancelled"] | None = None,
    flag: Literal["outlier", "repetition", "collapse", "any"] | None = None,
    limit: Annotated[int, Query(ge=1, le=500)] = 50,
    cursor: Annotated[str | None, Query(max_length=512)] = None,
) -> RequestQuery:
    return RequestQuery(sort, order == "desc", status, flag, limit, cursor)


@router.get("/requests")
def get_requests(
    db: DbDep, window: WindowDep, filters: FiltersDep, query: Annotated[RequestQuery, Depends(query_param)]
) -> Response:
    """One page of requests: {rows: [...], next_cursor} (next_cursor null on the last page)."""
    try:
        return json_response(request_reads.list_requests(db, window, filters, query))
    except BadCursor as exc:
        raise HTTPException(422, {"error": "invalid_cursor", "message": str(exc)}) from None


@router.get("/requests/{request_id:path}")
def get_request(db: DbDep, grant: ReadGrantDep, request_id: str) -> Response:
    """One request: every stored field, per-position acceptance, TPOT and its anomaly flags. A
    tenant-bound token finds its tenant's requests by the stored id (`tenant:id`) or the id it sent."""
    tenant = grant.tenant if grant else None
    found = request_reads.request_detail(db, request_id)
    if tenant is not None and not _of_tenant(found, tenant):
        found = request_reads.request_detail(db, scoped_id(tenant, request_id))
    if found is None or (tenant is not None and not _of_tenant(found, tenant)):
        raise HTTPException(404, {"error": "not_found", "message": f"no request {request_id!r}"})
    return json_response(found)


def _of_tenant(found, tenant: str) -> bool:
    return found is not None and found.record.get("tags", {}).get("tenant") == tenant
