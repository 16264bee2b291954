"""GET /openapi.json, /docs and /redoc: FastAPI's own pages, behind a read token like the API
(the app is created with its default documentation routes off).

The Swagger UI page fetches /openapi.json without the page's Authorization header, so with tokens
configured read the schema with `curl -H "Authorization: Bearer $TOKEN" .../openapi.json`."""

from __future__ import annotations

from fastapi import APIRouter, Depends, Request, Response
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html

from specwatch.service.deps import json_response, read_access

router = APIRouter(dependencies=[Depends(read_access)], include_in_schema=False)
OPENAPI_URL = "/openapi.json"


@router.get(OPENAPI_URL)
async def openapi(request: Request) -> Response:
    return json_response(request.app.openapi())


@router.get("/docs")
async def swagger() -> Response:
    return get_swagger_ui_html(openapi_url=OPENAPI_URL, title="specwatch collector - Swagger UI")


@router.get("/redoc")
async def redoc() -> Response:
    return get_redoc_html(openapi_url=OPENAPI_URL, title="specwatch collector - ReDoc")
