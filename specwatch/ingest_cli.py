"""`specwatch ingest trtllm-perf FILE --collector URL --instance NAME --model NAME`: TensorRT-LLM's
per-request perf metrics (collector.ingest.trtllm_perf) sent to the collector's ingest API.

The whole file is read and checked first: a bad line is a message naming its number (exit 2) and nothing
is sent. Records then go in batches; each batch is stored atomically, and request ids are idempotency keys,
so a run that stopped part-way can simply be repeated.
"""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path

import httpx

from specwatch.collector.ingest.trtllm_perf import BadLine, Source, read_records
from specwatch.common.auth import first_token
from specwatch.common.errors import UsageError
from specwatch.telemetry.schema import DRAFTER_PATTERN, VLLM_METHODS

BATCH = 5000


def register(subparsers: argparse._SubParsersAction) -> None:
    ingest = subparsers.add_parser("ingest", help="send an engine's own per-request records to the collector")
    kinds = ingest.add_subparsers(dest="kind", required=True, metavar="KIND")
    perf = kinds.add_parser("trtllm-perf", help="TensorRT-LLM /perf_metrics answers, one JSON array or object a line")
    add = perf.add_argument
    add("file", type=Path, help="the JSONL file")
    add("--collector", default=os.environ.get("SPECWATCH_COLLECTOR_URL"), help="the collector's base URL "
        "(default: SPECWATCH_COLLECTOR_URL)")  # fmt: skip
    add("--collector-token", default=first_token(os.environ.get("SPECWATCH_INGEST_TOKEN")),
        help="default: SPECWATCH_INGEST_TOKEN")  # fmt: skip
    add("--instance", required=True, help="the server's name, as the records will carry it")
    add("--model", required=True, help="the model it served")
    add("--drafter", help="its speculative method (eagle3, mtp, ngram, draft_model:NAME); none: it did not speculate")
    add("--clock-offset", type=float, help="epoch seconds minus the server's steady clock (default: estimated "
        "from the file's modification time, records tagged clock=estimate:file_mtime)")  # fmt: skip
    perf.set_defaults(handler=run_trtllm_perf)


def run_trtllm_perf(args: argparse.Namespace) -> int:
    if not args.collector:
        raise UsageError("--collector URL is required (or set SPECWATCH_COLLECTOR_URL)")
    records = _read(args)
    headers = {"authorization": f"Bearer {args.collector_token}"} if args.collector_token else {}
    stored = duplicates = 0
    with httpx.Client(base_url=args.collector.rstrip("/"), headers=headers, timeout=60.0) as http:
        for start in range(0, len(records), BATCH):
            batch = [r.model_dump(mode="json") for r in records[start : start + BATCH]]
            summary = _send(http, batch, start)
            stored += summary["requests"]["accepted"]
            duplicates += summary["requests"]["duplicates"]
    print(f"{len(records)} records from {args.file}: {stored} stored, {duplicates} already there")
    return 0


def _read(args: argparse.Namespace) -> list:
    if args.drafter is not None and not re.fullmatch(DRAFTER_PATTERN, args.drafter):
        raise UsageError(f"--drafter {args.drafter!r} is none of {', '.join(VLLM_METHODS)}, draft_model:NAME")
    source = Source(args.instance, args.model, args.drafter, args.clock_offset)
    try:
        with args.file.open(encoding="utf-8") as lines:
            return read_records(lines, source, written_at=args.file.stat().st_mtime)
    except OSError as exc:
        raise UsageError(f"cannot read {args.file}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"{args.file} is not UTF-8 text") from None
    except BadLine as exc:
        raise UsageError(f"{args.file}: {exc}; nothing was sent") from None


def _send(http: httpx.Client, batch: list[dict], start: int) -> dict:
    try:
        response = http.post("/v1/ingest", json={"requests": batch})
    except httpx.HTTPError as exc:
        raise UsageError(f"collector unreachable ({exc}); {start} records were sent before") from None
    if response.status_code != 200:
        raise UsageError(
            f"collector answered {response.status_code}: {response.text[:300]}; {start} records were sent before "
            "(request ids are idempotency keys: running again is safe)"
        )
    return response.json()
