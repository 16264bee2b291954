"""GET /v1/...: the query layer (`collector.reads.queries`, `collector.reads.series`) over HTTP.

Every endpoint takes a window (`start` and `end` epoch seconds, or `last` seconds up to
now, default 300) and filters (`instance`, `model`, `drafter` ("none" for no drafter),
`mode`, `arm`, and repeated `tag=key:value`).

With tokens configured every endpoint needs a `read` token. A tenant-bound token's filters always
include its tenant's tag (`filters_param`); endpoints over data that carries no tenant (device
samples, events, vLLM scrapes, sources) refuse such a token with 403.
"""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Depends, HTTPException, Query, Response

from specwatch.alerts.retrain import slice_export
from specwatch.collector.ingest import vllm
from specwatch.collector.reads import breakdown, reader, series, slices
from specwatch.collector.reads.queries import Filters, Window
from specwatch.service.deps import DbDep, ReadGrantDep, SettingsDep, json_response, read_access, read_all_tenants

router = APIRouter(prefix="/v1", dependencies=[Depends(read_access)])
MAX_WINDOW_S = 400 * 86400


def window_param(
    start: float | None = None, end: float | None = None, last: Annotated[float, Query(gt=0)] = 300.0
) -> Window:
    if (start is None) != (end is None):
        raise HTTPException(422, {"error": "invalid_window", "message": "give both start and end, or last"})
    try:
        window = Window(start, end) if start is not None else Window.last(last)
    except ValueError as exc:
        raise HTTPException(422, {"error": "invalid_window", "message": str(exc)}) from None
    if window.seconds > MAX_WINDOW_S:
        raise HTTPException(422, {"error": "invalid_window", "message": "window longer than 400 days"})
    return window


def filters_param(
    grant: ReadGrantDep,
    instance: str | None = None,
    model: str | None = None,
    drafter: str | None = None,
    mode: Literal["speculative", "autoregressive"] | None = None,
    arm: Literal["spec", "control"] | None = None,
    tag: Annotated[list[str], Query()] = [],  # noqa: B006 - FastAPI copies defaults
) -> Filters:
    pairs = [t.partition(":") for t in tag]
    if any(not key or not sep for key, sep, _ in pairs):
        raise HTTPException(422, {"error": "invalid_tag", "message": "tag must be key:value"})
    tags = tuple((k, v) for k, _, v in pairs) + ((("tenant", grant.tenant),) if grant and grant.tenant else ())
    return Filters(instance, model, drafter, mode, arm, tags)


WindowDep = Annotated[Window, Depends(window_param)]
FiltersDep = Annotated[Filters, Depends(filters_param)]


@router.get("/signals")
def get_signals(db: DbDep, window: WindowDep, filters: FiltersDep) -> Response:
    """Counts, throughput, acceptance and TTFT/e2e/TPOT percentiles of the window (up to 6 h from
    the per-second aggregates, rollups beyond; percentiles from DDSketches within 1% in both, from
    histograms, `basis: "histogram"`, where rollup rows predate migration 0011)."""
    return json_response(reader.signals(db, window, filters))


@router.get("/acceptance/positions")
def get_positions(db: DbDep, window: WindowDep, filters: FiltersDep) -> Response:
    return json_response(reader.positions(db, window, filters))


@router.get("/acceptance/definitions")
def get_definitions(db: DbDep, window: WindowDep, filters: FiltersDep) -> Response:
    """Acceptance as the mean, at position 0 (conditional) and as acceptance length / (k + 1), overall and
    per k, and the instances among the window's records whose acceptance is lossy or forced, and why
    (docs/glossary.md)."""
    return json_response(reader.definitions(db, window, filters))


@router.get("/acceptance/length")
def get_length(
    db: DbDep,
    window: WindowDep,
    filters: FiltersDep,
    by: Literal["prompt_tokens", "output_tokens"] = "prompt_tokens",
) -> Response:
    return json_response(reader.acceptance_vs_length(db, window, filters, by))


@router.get("/acceptance/slices")
def get_slices(
    db: DbDep,
    settings: SettingsDep,
    window: WindowDep,
    filters: FiltersDep,
    baseline: Annotated[float | None, Query(gt=0, le=MAX_WINDOW_S, allow_inf_nan=False)] = None,
    alpha: Annotated[float, Query(gt=0, lt=1)] = 0.05,
    min_requests: Annotated[int, Query(ge=2, le=1_000_000)] = 20,
    min_captures: Annotated[int, Query(ge=1, le=1_000_000)] = 16,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> Response:
    """Per drafter, model, tenant, scenario and prompt-length band: acceptance in the window against the
    `baseline` seconds before it (default: as long as the window), a one-sided Mann-Whitney U p-value and its
    Benjamini-Hochberg q-value, `lost` (q < alpha and acceptance fell), and the slice's exportable captures
    (a count, never text), `retrain_candidate` (at least `min_captures`) and the command that exports them
    (`collector.reads.slices`, docs/collector.md)."""
    config = slices.SliceSettings(alpha, min_requests, min_captures, limit)
    report = slices.acceptance_slices(db, window, slices.baseline_before(window, baseline), filters, config)
    body = {**report.__dict__, "slices": [_with_export(s, settings.external_url) for s in report.slices]}
    return json_response(body)


def _with_export(found: slices.AcceptanceSlice, external_url: str) -> dict:
    command = slice_export(external_url, found.drafter, found.model, found.tenant, found.scenario, found.prompt_tokens)
    return {**found.__dict__, "export_command": command}


@router.get("/errors/by-hour")
def get_errors_by_hour(db: DbDep, window: WindowDep, filters: FiltersDep) -> Response:
    return json_response(reader.errors_by_hour(db, window, filters))


@router.get("/series")
def get_series(
    db: DbDep, window: WindowDep, filters: FiltersDep, step: Annotated[float, Query(ge=1, allow_inf_nan=False)] = 60.0
) -> Response:
    """Per-step series: from the per-second aggregates up to 6 h, from the rollups beyond (sketch
    percentiles in both), exact from raw rows with tag filters (`collector.reads.reader`)."""
    try:
        return json_response(reader.series(db, window, filters, step))
    except ValueError as exc:
        raise HTTPException(422, {"error": "invalid_step", "message": str(exc)}) from None


@router.get("/devices/latest", dependencies=[Depends(read_all_tenants)])
def get_devices(db: DbDep, instance: str | None = None) -> Response:
    return json_response(series.latest_device_samples(db, instance))


@router.get("/events", dependencies=[Depends(read_all_tenants)])
def get_events(
    db: DbDep,
    window: WindowDep,
    instance: str | None = None,
    kind: str | None = None,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> Response:
    """Engine events in the window (oldest first)."""
    return json_response(series.engine_events(db, window, instance, kind, limit))


@router.get("/vllm/signals", dependencies=[Depends(read_all_tenants)])
def get_vllm_signals(db: DbDep, window: WindowDep, source: str | None = None, model: str | None = None) -> Response:
    """Acceptance, per-position acceptance and TTFT/e2e percentiles of scraped vLLM engines."""
    return json_response(vllm.vllm_signals(db, window, source, model))


def _bad_value(call):
    try:
        return json_response(call())
    except ValueError as exc:
        raise HTTPException(422, {"error": "invalid_parameter", "message": str(exc)}) from None


@router.get("/breakdown")
def get_breakdown(db: DbDep, window: WindowDep, filters: FiltersDep, by: str = "drafter") -> Response:
    """Acceptance, latency (percentiles and CDF points), energy per token per group:
    `by` = mode | arm | drafter | instance | model | mode_reason | tag:<key>."""
    return _bad_value(lambda: breakdown.breakdown(db, window, filters, by))


@router.get("/compare")
def get_compare(db: DbDep, window: WindowDep, filters: FiltersDep, by: Literal["arm", "mode"] = "arm") -> Response:
    """Speculative vs plain latency per output token: speed-up and Mann-Whitney U p-value."""
    return _bad_value(lambda: breakdown.compare(db, window, filters, by))


@router.get("/throughput/by-load")
def get_throughput_by_load(db: DbDep, window: WindowDep, filters: FiltersDep) -> Response:
    return json_response(breakdown.throughput_by_load(db, window, filters))


@router.get("/devices/series", dependencies=[Depends(read_all_tenants)])
def get_device_series(
    db: DbDep,
    window: WindowDep,
    instance: str | None = None,
    max_points: Annotated[int, Query(ge=10, le=100_000)] = 2000,
) -> Response:
    return json_response(breakdown.device_series(db, window, instance, max_points))


@router.get("/sources", dependencies=[Depends(read_all_tenants)])
def get_sources(db: DbDep, window: WindowDep) -> Response:
    """Engines and scraped vLLM servers: last seen, records in the window, records/s."""
    return json_response(breakdown.sources(db, window))


@router.get("/labels")
def get_labels(
    db: DbDep, window: WindowDep, filters: FiltersDep, tags: Literal["scenario", "none"] = "scenario"
) -> Response:
    """Requests per instance, model, drafter, mode, arm and scenario tag in the window (tag counts from a
    sample of a large window, scaled: `sampled` then says how many of how many requests). `tags=none`
    leaves the tag out: the labels alone come from the aggregates and need no sample."""
    tag_keys = () if tags == "none" else ("scenario",)
    return json_response(reader.label_values(db, window, filters, tag_keys))
