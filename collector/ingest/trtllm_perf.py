"""TensorRT-LLM's per-request perf metrics (a JSONL file) as RequestRecords.

trtllm-serve started with `return_perf_metrics: true` (and `perf_metrics_max_requests`) answers
`GET /perf_metrics` with the requests finished since the last call (NVIDIA/TensorRT-LLM
`tensorrt_llm/serve/openai_server.py`, `get_perf_metrics`, read at commit
00057725d9a6591f033e44f31c219e2426827bb7); appending each answer to a file gives one JSON array per line,
and a line may equally hold one element of it:

    {"request_id": 7, "perf_metrics": {"first_iter": 10, "last_iter": 42,
        "timing_metrics": {"arrival_time", "first_scheduled_time", "first_token_time", "last_token_time", ...},
        "kv_cache_metrics": {...},
        "speculative_decoding": {"acceptance_rate", "total_accepted_draft_tokens", "total_draft_tokens"}}}

`speculative_decoding` is there only when the request drafted (total_draft_tokens > 0). Times are seconds
of the server's steady clock: `clock_offset` (epoch s - steady s) puts them on the wall clock.

What the record holds, and how:
- acceptance rate: accepted / drafted tokens, exact (TensorRT-LLM's own `acceptance_rate`, accepted /
  drafted, is kept as the tag `trtllm_acceptance_rate`).
- drafts (verify steps): `last_iter - first_iter`, the generation iterations after the context one, each a
  verify step while drafting: an estimate (tag `counts=estimate:iterations`), as are
- output tokens: the context iteration's token plus each step's accepted tokens and one; and
- prompt tokens: not in these records; 0, tagged `prompt_tokens=unknown`.
Impossible values (negative, accepted > drafted, times out of order) are clamped and tagged
(telemetry.clamps); a line that is no such record is refused with its line number, and nothing is sent.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import ValidationError

from specwatch.telemetry.clamps import CLAMPED_TAG, clamp_accepted
from specwatch.telemetry.schema import MAX_TOKENS, RequestRecord

ESTIMATE_TAGS = {"counts": "estimate:iterations", "prompt_tokens": "unknown", "engine": "tensorrt-llm"}
_TIMES = ("arrival_time", "first_scheduled_time", "first_token_time", "last_token_time")


class BadLine(ValueError):
    """A line that is no perf-metrics record; `line` is 1-based."""

    def __init__(self, line: int, message: str) -> None:
        super().__init__(f"line {line}: {message}")
        self.line = line


@dataclass(frozen=True)
class Source:
    """Who served the requests of a file: names the records carry, and its clock's offset."""

    instance: str
    model: str
    drafter: str | None  # the speculative method it was started with; None: it does not speculate
    clock_offset: float | None  # epoch s - steady-clock s; None: estimated (read_records)


def read_records(lines: Iterable[str], source: Source, written_at: float) -> list[RequestRecord]:
    """Every record of the file, or BadLine for the first line that is none (so nothing half-read is sent).
    Without a clock offset, the newest last token is taken to be `written_at` (the file's modification
    time), and every record is tagged `clock=estimate:file_mtime`."""
    items = list(_items(lines))
    tags = {}
    if source.clock_offset is None:
        newest = max((_last_token(number, item) for number, item in items), default=written_at)
        source = Source(source.instance, source.model, source.drafter, written_at - newest)
        tags = {"clock": "estimate:file_mtime"}
    return [_record(number, item, source, tags) for number, item in items]


def _items(lines: Iterable[str]) -> Iterable[tuple[int, Any]]:
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            found = orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise BadLine(number, f"not JSON ({exc})") from None
        for item in found if isinstance(found, list) else [found]:
            yield number, item


def _last_token(number: int, item: Any) -> float:
    try:
        return _times(_object(_object(item, "record")["perf_metrics"], "perf_metrics")["timing_metrics"])[-1]
    except (KeyError, TypeError) as exc:
        raise BadLine(number, f"not a perf-metrics record: {_missing(exc)}") from None


def _record(number: int, item: Any, source: Source, tags: dict[str, str]) -> RequestRecord:
    try:
        fields = _fields(item, source, tags)
        return RequestRecord.model_validate(fields)
    except (KeyError, TypeError) as exc:
        raise BadLine(number, f"not a perf-metrics record: {_missing(exc)}") from None
    except ValueError as exc:  # pydantic's ValidationError, or a count the source cannot have
        raise BadLine(number, _explain(exc)) from None


def _explain(exc: ValueError) -> str:
    if not isinstance(exc, ValidationError):
        return str(exc)
    error = exc.errors()[0]
    where = ".".join(str(part) for part in error["loc"]) or "record"
    hint = " (pass --clock-offset: epoch seconds minus the server's steady clock)" if where == "started_at" else ""
    return f"{where}: {error['msg']}{hint}"


def _fields(item: Any, source: Source, extra_tags: dict[str, str]) -> dict:
    metrics = _object(_object(item, "record")["perf_metrics"], "perf_metrics")
    request_id, times = item["request_id"], _times(metrics["timing_metrics"])
    tags: dict[str, str] = {**ESTIMATE_TAGS, **extra_tags}
    counts = _counts(metrics, tags)
    if counts["num_draft_tokens"] and not source.drafter:
        raise ValueError("the request drafted: pass --drafter with the server's speculative method")
    arrival, scheduled, first, last = _ordered(times, tags)
    return {
        "request_id": f"trtllm:{source.instance}:{request_id}:{arrival:.6f}",
        "instance": source.instance,
        "model": source.model,
        "drafter": source.drafter,
        "mode": "speculative" if source.drafter else "autoregressive",
        "started_at": arrival + (source.clock_offset or 0.0),
        "queue_s": scheduled - arrival,
        "ttft_s": first - arrival,
        "e2e_s": last - arrival,
        "prompt_tokens": 0,
        **counts,
        "tags": tags,
    }


def _times(timing: Any) -> list[float]:
    times = [_object(timing, "timing_metrics")[name] for name in _TIMES]
    if not all(type(t) in (int, float) and math.isfinite(t) for t in times):
        raise TypeError("timing_metrics must hold finite numbers")
    return [float(t) for t in times]


def _ordered(times: list[float], tags: dict[str, str]) -> list[float]:
    """arrival <= scheduled <= first token <= last token; a time before its predecessor is moved up to it."""
    ordered = [times[0]]
    for t in times[1:]:
        ordered.append(max(t, ordered[-1]))
    if ordered != times:
        tags["times_clamped"] = "out_of_order"
    return ordered


def _counts(metrics: dict, tags: dict[str, str]) -> dict:
    """Draft counts and output tokens; steps = generation iterations (estimate)."""
    steps = _int(metrics["last_iter"]) - _int(metrics["first_iter"])
    spec = _object(metrics.get("speculative_decoding") or {}, "speculative_decoding")
    drafted = _int(spec.get("total_draft_tokens", 0))
    accepted_reported = _int(spec.get("total_accepted_draft_tokens", 0))
    if type(spec.get("acceptance_rate")) in (int, float):
        tags["trtllm_acceptance_rate"] = f"{spec['acceptance_rate']:.6g}"
    broke = ["negative_iterations"] if steps < 0 else []
    if drafted < 0:
        broke.append("negative_drafted")
    steps, drafted = max(0, steps), max(0, drafted)
    accepted, reason = clamp_accepted(accepted_reported, drafted, None)
    # a verify step holds at least one draft token, and a request that drafted verified at least once
    drafts = max(1, min(steps, drafted)) if drafted else 0
    broke += [reason] if reason else []
    if broke:
        tags[CLAMPED_TAG] = f"{'+'.join(broke)}:{accepted_reported}"
    output = min(MAX_TOKENS, 1 + steps + accepted)
    return {"output_tokens": output, "num_drafts": drafts, "num_draft_tokens": drafted, "num_accepted_tokens": accepted}


def _int(value: Any) -> int:
    if type(value) is not int:
        raise TypeError(f"{value!r} is no integer count")
    return value


def _object(value: Any, name: str) -> dict:
    if not isinstance(value, dict):
        raise TypeError(f"{name} must be a JSON object")
    return value


def _missing(exc: Exception) -> str:
    return f"no field {exc.args[0]!r}" if isinstance(exc, KeyError) else str(exc)
