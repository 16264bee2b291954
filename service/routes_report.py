"""GET /v1/reports (the monthly reports written under `SPECWATCH_REPORT_DIR`) and
GET /v1/reports/<file>: one report, `specwatch-report-YYYY-MM.html` or `.json` (the link the
webhooks receive). 404 when no report directory is configured or the file is not there.
GET /v1/report?month=YYYY-MM builds a month's HTML report on demand (the dashboard's download)."""

from __future__ import annotations

import re

from fastapi import APIRouter, Depends, HTTPException, Response
from fastapi.responses import FileResponse

from specwatch.service.deps import DbDep, SettingsDep, admin_access, json_response, read_all_tenants

router = APIRouter(prefix="/v1/reports", dependencies=[Depends(read_all_tenants)])
on_demand = APIRouter(prefix="/v1", dependencies=[Depends(admin_access)])  # builds a report: costly
_NAME = re.compile(r"specwatch-report-\d{4}-\d{2}\.(html|json)")


@router.get("")
def list_reports(settings: SettingsDep) -> Response:
    folder = settings.report_dir
    names = sorted(p.name for p in folder.iterdir() if _NAME.fullmatch(p.name)) if folder and folder.is_dir() else []
    return json_response({"reports": names})


@router.get("/{name}")
def get_report(name: str, settings: SettingsDep) -> FileResponse:
    path = settings.report_dir / name if settings.report_dir is not None and _NAME.fullmatch(name) else None
    if path is None or not path.is_file():
        raise HTTPException(404, f"no report {name!r}")
    return FileResponse(path, media_type="text/html" if name.endswith(".html") else "application/json")


@on_demand.get("/report")
def build_html_report(db: DbDep, month: str, gpu: str | None = None) -> Response:
    from specwatch.cost.inputs import load_prices
    from specwatch.report.build import build_report
    from specwatch.report.html import render_html

    try:
        report = build_report(db, month, load_prices(), gpu_type=gpu)
    except ValueError as exc:
        raise HTTPException(422, {"error": "invalid_parameter", "message": str(exc)}) from None
    headers = {"Content-Disposition": f'attachment; filename="specwatch-report-{month}.html"'}
    return Response(render_html(report), media_type="text/html", headers=headers)
