"""GET /v1/tune: the speculation tuner's schedule over a window of the store (`cost.tuner`).

Window: `start` and `end`, or `last` seconds (default 1 day); the usual request filters. Options (each
optional; out of range is a 422 that says so): `current_k` (today's k; default the records' gamma) or
`current_config` (today's vLLM `--speculative-config` JSON, a schedule included),
`max_k`, `max_batch` (the server's max_num_seqs), `min_requests`, `min_drafts`, `method` (vLLM's
method name for the emitted config). The body is `cost.tuner_emit.plan_json`: per bucket today's k,
the recommended k, the predicted tokens/s curve with 95% intervals and the gain; the merged ranges;
vLLM's `--speculative-config` and TensorRT-LLM's `draft_len_schedule`; staleness and sources.
"""

from __future__ import annotations

import json
from typing import Annotated

from fastapi import APIRouter, Depends, HTTPException, Query, Response

from specwatch.collector.reads.queries import Window
from specwatch.cost.tuner import TuneRules
from specwatch.cost.tuner_data import recommend_from_store
from specwatch.cost.tuner_emit import plan_json, todays_ks
from specwatch.service.deps import DbDep, json_response, read_all_tenants
from specwatch.service.routes_query import FiltersDep, window_param

router = APIRouter(prefix="/v1", dependencies=[Depends(read_all_tenants)])  # a schedule is per server


def tune_window(
    start: float | None = None,
    end: float | None = None,
    last: Annotated[float, Query(gt=0, allow_inf_nan=False)] = 86_400.0,
) -> Window:
    return window_param(start, end, last)


def rules_param(
    max_k: Annotated[int, Query(ge=0, le=64)] = TuneRules.max_k,
    max_batch: Annotated[int, Query(ge=1, le=4096)] = TuneRules.max_batch,
    min_requests: Annotated[float, Query(gt=0, allow_inf_nan=False)] = TuneRules.min_requests,
    min_drafts: Annotated[float, Query(gt=0, allow_inf_nan=False)] = TuneRules.min_drafts,
) -> TuneRules:
    return TuneRules(min_requests, min_drafts, max_k, max_batch)


@router.get("/tune")
def get_tune(
    db: DbDep,
    filters: FiltersDep,
    window: Annotated[Window, Depends(tune_window)],
    rules: Annotated[TuneRules, Depends(rules_param)],
    current_k: Annotated[int | None, Query(ge=0, le=64)] = None,
    method: Annotated[str | None, Query(max_length=64, pattern=r"^[a-z0-9_:-]+$")] = None,
    current_config: Annotated[str | None, Query(max_length=4096)] = None,
) -> Response:
    """The k schedule per batch-size bucket that maximises predicted output tokens/s."""
    today = today_param(current_k, current_config, rules.max_batch)
    plan = recommend_from_store(db, window, filters, rules=rules, **today)
    return json_response(plan_json(plan, method))


def today_param(current_k: int | None, current_config: str | None, max_batch: int) -> dict:
    """current_k, and today's k per level from a vLLM config; a 422 naming what is wrong."""
    if current_config is None:
        return {"current_k": current_k}
    try:
        if current_k is not None:
            raise ValueError("give current_k or current_config, not both")
        k, today = todays_ks(json.loads(current_config), max_batch)
    except RecursionError:  # JSON nested past the parser's stack (4 KiB of brackets is enough)
        message = "current_config: nested too deeply to be a vLLM speculative config"
        raise HTTPException(422, {"error": "invalid_parameter", "message": message}) from None
    except ValueError as exc:  # json.JSONDecodeError is one
        raise HTTPException(422, {"error": "invalid_parameter", "message": f"current_config: {exc}"}) from None
    return {"current_k": k, "today": today}
