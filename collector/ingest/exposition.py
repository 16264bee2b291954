"""What a serving engine's Prometheus exposition holds, per engine: the one description the scraper
(collector.ingest.vllm) reads every engine's /metrics through.

A scrape row keeps counter deltas under the same four names whatever the engine (drafts, draft_tokens,
accepted_tokens, generation_tokens), so every read derives acceptance the same way (telemetry.ratios).
An engine that lacks one of them either derives it (`derive`) or leaves it 0, and its docs say which.
Gauges are never read as counters: an interval snapshot summed over scrapes means nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

COLUMNS = ("drafts", "draft_tokens", "accepted_tokens", "generation_tokens")


@dataclass(frozen=True)
class EngineSchema:
    """The families one engine exposes and how they map onto a scrape row."""

    name: str  # the engine, as docs and logs name it
    prefix: str  # every family of the engine starts with it; it identifies the exposition
    counters: dict[str, str]  # family (without `_total`) -> counter name in the Snapshot
    per_position: str | None = None  # family of accepted tokens per draft position
    position_label: str = "position"
    # family of drafted tokens per position (TensorRT-LLM): its position 0 counts the drafts, its sum the
    # draft tokens; with it, the accepted tokens are the sum over `per_position` too
    drafted_per_position: str | None = None
    histograms: dict[str, str] = field(default_factory=dict)  # family -> ttft | e2e
    model_label: str = "model_name"
    rank_label: str = "engine"  # data-parallel rank label: one row per value
    # families exposed only while the engine speculates; empty: the engine always exposes them, and it
    # counts as speculating once its drafts counter is above 0
    spec_families: frozenset[str] = frozenset()
    # the row's counter deltas from the Snapshot's counter deltas (default: the same names)
    derive: Callable[[dict[str, float]], dict[str, float]] | None = None

    def families(self) -> set[str]:
        positions = [f for f in (self.per_position, self.drafted_per_position) if f]
        return {*self.counters, *self.histograms, *positions}

    def columns(self, deltas: dict[str, float]) -> dict[str, float]:
        """The row's four counter columns from this scrape's deltas."""
        found = self.derive(deltas) if self.derive else deltas
        return {name: max(0.0, found.get(name, 0.0)) for name in COLUMNS}


def schema_for(text: str, schemas: tuple[EngineSchema, ...], default: EngineSchema) -> EngineSchema:
    """The engine whose prefix starts a sample line of the exposition (else `default`)."""
    for schema in schemas:
        if text.startswith(schema.prefix) or f"\n{schema.prefix}" in text:
            return schema
    return default
