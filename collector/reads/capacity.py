"""Speculation-aware capacity per upstream: the output tokens/s each can serve at its current acceptance and load.

Each stored request that finished ok with output and an attributed device time (`device_s`: the
engine's share of each batched forward, the gateway's processor-sharing share of its upstream)
says how many tokens one second of that upstream's busy time produced, at the acceptance and the
batching it met. The estimate is their ratio of sums, each request weighted by how recently it
finished (time constant `tau_s`):

    w_i = exp(-(now - finished_i) / tau_s)        finished_i = started_at + e2e_s <= now
    capacity = sum(w_i * output_tokens_i) / sum(w_i * device_s_i)

A switch of speculation off (or on) changes tokens per device-second at once, but the estimate
only blends the new requests in: at a steady request rate it moves by at most
`(1 - exp(-dt / tau_s)) * old / new` of the gap in `dt` seconds (10% per 15 s scrape at tau 360 s
when capacity falls 2.5x), so an autoscaler reading it sees a ramp, not a step.
Requests older than `horizon * tau_s` are left out (weight below exp(-horizon)). Gateway records
carry the upstream's name as `instance`, engine records the engine's, so the label is the upstream.
Records without device_s (e.g. vLLM's spans taken in over OTLP) give no estimate.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

from sqlalchemy import Engine, select

from specwatch.collector.models import Request

TAU_S = 360.0


@dataclass(frozen=True)
class CapacityRules:
    tau_s: float = TAU_S  # smoothing time constant of the estimate
    horizon: float = 3.0  # requests that finished more than horizon * tau_s ago are left out
    min_requests: int = 5  # fewer recent requests than this: no estimate for the upstream


@dataclass(frozen=True)
class Capacity:
    instance: str
    tokens_per_s: float
    requests: int  # recent requests behind the estimate


@dataclass(frozen=True)
class Served:
    """One request's share of an upstream's work."""

    finished: float
    output_tokens: int
    device_s: float


def estimate(served: list[Served], now: float, rules: CapacityRules = CapacityRules()) -> float | None:
    """The time-weighted tokens per device-second of `served` at `now`; None without enough of them."""
    recent = [s for s in served if now - rules.horizon * rules.tau_s <= s.finished <= now]
    if len(recent) < rules.min_requests:
        return None
    weights = [math.exp(-(now - s.finished) / rules.tau_s) for s in recent]
    busy = sum(w * s.device_s for w, s in zip(weights, recent))
    return sum(w * s.output_tokens for w, s in zip(weights, recent)) / busy if busy > 0 else None


def upstream_capacity(db: Engine, now: float, rules: CapacityRules = CapacityRules()) -> list[Capacity]:
    """The estimate of every upstream with enough recent requests, by instance."""
    by_instance: dict[str, list[Served]] = defaultdict(list)
    for instance, served in _recent(db, now, rules):
        by_instance[instance].append(served)
    out = []
    for instance, served in sorted(by_instance.items()):
        value = estimate(served, now, rules)
        if value is not None:
            out.append(Capacity(instance, value, len(served)))
    return out


def _recent(db: Engine, now: float, rules: CapacityRules) -> list[tuple[str, Served]]:
    finished = Request.started_at + Request.e2e_s
    query = select(Request.instance, finished, Request.output_tokens, Request.device_s).where(
        Request.started_at >= now - rules.horizon * rules.tau_s,
        Request.started_at <= now,
        Request.status == "ok",
        Request.output_tokens > 0,
        Request.device_s > 0,
    )
    with db.connect() as connection:
        rows = connection.execute(query).all()
    return [(instance, Served(end, tokens, device_s)) for instance, end, tokens, device_s in rows]
