"""Turning a request body into a validated `IngestBatch`, or a 4xx that says what is wrong.

The body is parsed with orjson (rejects NaN/Infinity literals, invalid UTF-8 and lone
surrogates) and validated as a whole before anything is stored.
"""

from __future__ import annotations

from typing import Any

import orjson
from pydantic import ValidationError

from collector.schema import IngestBatch
from collector.store import DataRejected, IngestCounts, Store, StoreUnavailable

MAX_REPORTED_ERRORS = 20


class BatchRejected(Exception):
    """A batch that must not be stored: `status` is the HTTP code, `detail` the JSON body's detail."""

    def __init__(self, status: int, reason: str, detail: Any) -> None:
        super().__init__(reason)
        self.status, self.reason, self.detail = status, reason, detail


def store_body(store: Store, body: bytes) -> IngestCounts:
    """Parse, validate and store one request body in one transaction."""
    batch = parse_batch(body)
    try:
        return store.insert(batch)
    except DataRejected as exc:
        raise BatchRejected(422, "rejected_by_database", {"error": "rejected_by_database", "message": str(exc)}) from None
    except StoreUnavailable as exc:  # nothing was stored; the client keeps the batch and retries
        raise BatchRejected(503, "store_unavailable", {"error": "store_unavailable", "message": str(exc)}) from None


def parse_batch(body: bytes) -> IngestBatch:
    try:
        payload = orjson.loads(body)
    except orjson.JSONDecodeError as exc:
        raise BatchRejected(400, "invalid_json", {"error": "invalid_json", "message": str(exc)}) from None
    try:
        return IngestBatch.model_validate(payload)
    except ValidationError as exc:
        errors = [_describe(e) for e in exc.errors(include_url=False, include_input=False)[:MAX_REPORTED_ERRORS]]
        raise BatchRejected(422, "invalid_batch", {"error": "invalid_batch", "count": exc.error_count(), "errors": errors}) from None


def _describe(error: dict[str, Any]) -> dict[str, Any]:
    """`("requests", 3, "gamma")` -> item `requests[3]`, field `gamma`."""
    loc = list(error["loc"])
    blamed = getattr(error.get("ctx", {}).get("error"), "field", None)  # a schema.FieldError
    if blamed:
        loc.append(blamed)
    item = f"{loc[0]}[{loc[1]}]" if len(loc) >= 2 and isinstance(loc[1], int) else (str(loc[0]) if loc else None)
    rest = loc[2:] if item and "[" in item else loc[1:]
    field = ".".join(str(part) for part in rest) or None
    return {"item": item, "field": field, "message": error["msg"], "type": error["type"]}
