"""/metrics under free-form label values: its size and scrape time after N requests with distinct models.

    python bench/metrics_labels.py [--models 100000] [--drafters 0] [--tenants 1] [--batch 5000] [--json F]

The real service (service.app on SQLite in a temporary directory, ingest in process) takes N requests
on one instance, each with its own `model` value (and, with --drafters, `drafter=model:d-i` over that
many values), spread over --tenants `tenant` tags, posted to /v1/ingest in batches; then one GET
/metrics is timed, and its size and sample lines counted. Issue 53 #2: 100,000 model names grew
/metrics to 1,183 MB and a scrape to 143 s before label values were capped (collector.label_budget).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import orjson
from fastapi.testclient import TestClient

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specwatch.collector.settings import Settings  # noqa: E402
from specwatch.service.app import create_app  # noqa: E402

GOAL_MB = 5.0  # docs/benchmarks.md: /metrics bounded, < 5 MB at 5,000 model names


def request(i: int, now: float, drafters: int, tenants: int) -> dict:
    drafter = f"model:d-{i % drafters}" if drafters else "ngram"
    return {
        "request_id": f"r-{i}",
        "instance": "gpu-0",
        "model": f"m-{i}",
        "drafter": drafter,
        "mode": "speculative",
        "started_at": now - 60 + i * 1e-4,
        "ttft_s": 0.05,
        "e2e_s": 1.0,
        "prompt_tokens": 100,
        "output_tokens": 64,
        "num_drafts": 4,
        "num_draft_tokens": 16,
        "num_accepted_tokens": 10,
        "accepted_per_position": [4, 3, 2, 1],
        "gamma": 4,
        "tags": {"tenant": f"t-{i % tenants}"},
    }


def run(models: int, drafters: int, tenants: int, batch: int) -> dict:
    now = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        settings = Settings(
            data_dir=Path(tmp), database_url=f"sqlite:///{tmp}/specwatch.db", ingest_processes=0, metrics_public=True
        )
        with TestClient(create_app(settings)) as client:
            started = time.monotonic()
            for first in range(0, models, batch):
                body = {
                    "requests": [request(i, now, drafters, tenants) for i in range(first, min(models, first + batch))]
                }
                client.post("/v1/ingest", content=orjson.dumps(body), headers={"content-type": "application/json"})
            ingest_s = time.monotonic() - started
            started = time.monotonic()
            scraped = client.get("/metrics")
            scrape_s = time.monotonic() - started
            lines = sum(1 for line in scraped.text.splitlines() if line and not line.startswith("#"))
            folded = sum(
                float(line.rsplit(" ", 1)[1])
                for line in scraped.text.splitlines()
                if line.startswith("specwatch_metrics_folded_requests_total")
            )
    return {
        "models": models,
        "drafters": drafters,
        "tenants": tenants,
        "ingest_s": round(ingest_s, 2),
        "metrics_bytes": len(scraped.content),
        "metrics_lines": lines,
        "scrape_s": round(scrape_s, 3),
        "folded_requests": int(folded),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", type=int, default=100_000)
    parser.add_argument("--drafters", type=int, default=0)
    parser.add_argument("--tenants", type=int, default=1)
    parser.add_argument("--batch", type=int, default=5_000)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    if min(args.models, args.tenants, args.batch) < 1 or args.drafters < 0:
        parser.error("--models, --tenants and --batch must be >= 1, --drafters >= 0")
    result = run(args.models, args.drafters, args.tenants, args.batch)
    size_mb = result["metrics_bytes"] / 1e6
    print(
        f"/metrics after {args.models:,} distinct models ({args.drafters:,} drafters, {args.tenants:,} tenants): "
        f"{size_mb:.2f} MB, {result['metrics_lines']:,} samples, scrape {result['scrape_s']:.3f} s; "
        f"{result['folded_requests']:,} requests folded into `other`; "
        f"goal < {GOAL_MB:g} MB: {'met' if size_mb < GOAL_MB else 'NOT met'}"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
