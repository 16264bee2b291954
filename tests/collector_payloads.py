"""Valid telemetry payloads for the collector tests (a uniquely named module, importable from tests)."""

from __future__ import annotations

from typing import Any

import numpy as np

T0 = 1_780_000_000.0  # 2026-05-28T20:26:40Z, a fixed epoch for reproducible windows


def request_dict(i: int, **overrides: Any) -> dict[str, Any]:
    """A valid RequestRecord payload; `i` varies the id, time and counts."""
    accepted = [4, 3, 2, i % 2]
    record = {
        "request_id": f"req-{i}",
        "instance": "gpu-0",
        "model": "smollm2-135m",
        "drafter": "ngram",
        "mode": "speculative",
        "started_at": T0 + i,
        "ttft_s": 0.05 + (i % 10) / 100,
        "e2e_s": 1.0 + (i % 7) / 10,
        "prompt_tokens": 100 + i % 50,
        "output_tokens": 64,
        "num_drafts": 4,
        "num_draft_tokens": 16,
        "num_accepted_tokens": sum(accepted),
        "accepted_per_position": accepted,
        "gamma": 4,
        "tags": {"tenant": "acme" if i % 2 else "globex"},
    }
    return {**record, **overrides}


PLAIN = dict(
    mode="autoregressive",
    drafter=None,
    num_drafts=0,
    num_draft_tokens=0,
    num_accepted_tokens=0,
    accepted_per_position=[],
    gamma=0,
)


def plain_request_dict(i: int, **overrides: Any) -> dict[str, Any]:
    """A valid payload of a request served by plain decoding (no drafts)."""
    return request_dict(i, **{**PLAIN, **overrides})


def sample_dict(i: int, **overrides: Any) -> dict[str, Any]:
    sample = {
        "instance": "gpu-0",
        "at": T0 + 5 * i,
        "device": "cpu",
        "mem_allocated_bytes": 1_000 + i,
        "mem_reserved_bytes": 1_500 + i,
        "fragmentation": 1.5,
        "power_w": 40.0 + i,
        "power_source": "rapl",
        "util_target": 0.5,
        "util_draft": 0.1,
        "active_requests": 2,
        "queue_depth": i % 3,
        "load": 0.4,
    }
    return {**sample, **overrides}


def event_dict(i: int, **overrides: Any) -> dict[str, Any]:
    return {"instance": "gpu-0", "at": T0 + i, "kind": "mode_switch", "detail": {"to": "autoregressive"}, **overrides}


def varied_request(i: int, rng: np.random.Generator) -> dict:
    """Requests over 20 minutes, two instances; every 4th autoregressive; acceptance grows with prompt length."""
    prompt = int(rng.integers(10, 3000))
    if i % 4 == 0:
        extra = {
            "mode": "autoregressive",
            "drafter": None,
            "num_drafts": 0,
            "num_draft_tokens": 0,
            "num_accepted_tokens": 0,
            "accepted_per_position": [],
            "gamma": 0,
        }
    else:
        drafts = int(rng.integers(5, 40))
        p = min(0.95, 0.2 + prompt / 4000)  # per-token acceptance, grows with length
        per_pos = [int(drafts * p ** (k + 1)) for k in range(4)]
        extra = {
            "num_drafts": drafts,
            "num_draft_tokens": 4 * drafts,
            "num_accepted_tokens": sum(per_pos),
            "accepted_per_position": per_pos,
            "gamma": 4,
        }
    return request_dict(
        i,
        started_at=T0 + i * 3.0,
        instance=f"gpu-{i % 2}",
        prompt_tokens=prompt,
        output_tokens=int(rng.integers(1, 200)),
        ttft_s=None if i % 13 == 0 else float(rng.gamma(2.0, 0.05)),
        e2e_s=float(rng.uniform(0.5, 5.0)),
        status="error" if i % 17 == 0 else "ok",
        error="target:oom" if i % 34 == 0 else None,
        **extra,
    )
