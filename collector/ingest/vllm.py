"""Scraping vLLM's Prometheus /metrics (and SGLang's, llama.cpp's, TensorRT-LLM's: collector.ingest.
sglang_metrics, llamacpp_metrics, trtllm_metrics, each found by its prefix) into per-interval deltas,
and querying them.

vLLM (v1) exposes, per (model_name, engine):
  vllm:spec_decode_num_drafts_total, vllm:spec_decode_num_draft_tokens_total,
  vllm:spec_decode_num_accepted_tokens_total, vllm:spec_decode_num_accepted_tokens_per_pos_total{position},
  vllm:time_to_first_token_seconds and vllm:e2e_request_latency_seconds (histograms),
each with `_created` series. A scrape is turned into the delta since the previous one; a
counter that went down, or a `_created` timestamp that changed, means vLLM restarted, and
then the new value itself is the delta (the counter restarted from zero). The first scrape
of a source (and the first after a collector restart) is only a baseline.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from dataclasses import dataclass, field

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, insert, select

from specwatch.collector.db import write_transaction
from specwatch.collector.ingest.exposition import EngineSchema, schema_for
from specwatch.collector.ingest.llamacpp_metrics import LLAMACPP
from specwatch.collector.ingest.sglang_metrics import SGLANG
from specwatch.collector.ingest.trtllm_metrics import TRTLLM
from specwatch.collector.models import VllmScrape
from specwatch.collector.reads.history import histogram_quantile
from specwatch.collector.reads.queries import Percentiles, Window
from specwatch.telemetry import ratios

log = logging.getLogger("specwatch.collector")
COUNTERS = {
    "vllm:spec_decode_num_drafts": "drafts",
    "vllm:spec_decode_num_draft_tokens": "draft_tokens",
    "vllm:spec_decode_num_accepted_tokens": "accepted_tokens",
    "vllm:generation_tokens": "generation_tokens",  # what drafts are compared with (drafting coverage)
}
SPEC_FAMILIES = {*list(COUNTERS)[:3], "vllm:spec_decode_num_accepted_tokens_per_pos"}  # present only when speculating
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos"
HISTOGRAMS = {"vllm:time_to_first_token_seconds": "ttft", "vllm:e2e_request_latency_seconds": "e2e"}
VLLM = EngineSchema(
    "vLLM", "vllm:", COUNTERS, PER_POSITION, histograms=HISTOGRAMS, spec_families=frozenset(SPEC_FAMILIES)
)
OTHER_ENGINES = (SGLANG, LLAMACPP, TRTLLM)


@dataclass
class Snapshot:
    """Cumulative values of one (model, engine) at one scrape."""

    counters: dict[str, float] = field(default_factory=dict)
    per_position: dict[int, float] = field(default_factory=dict)
    buckets: dict[str, dict[float, float]] = field(default_factory=dict)  # histogram -> le -> cumulative count
    sums: dict[str, float] = field(default_factory=dict)
    created: dict[str, float] = field(default_factory=dict)  # series -> _created timestamp
    speculating: bool = False  # the exposition carries spec-decode families (vLLM registers them only then)


def parse(text: str, schema: EngineSchema | None = None) -> dict[tuple[str, str], Snapshot]:
    """The spec-decode counters and latency histograms of an exposition, by (model, data-parallel rank);
    `schema` None: the engine its prefix names (vLLM unless another engine's). Series that differ only
    in other labels (SGLang's `is_streaming`) are summed; gauges and `_created` never enter a sum."""
    schema = schema or schema_for(text, OTHER_ENGINES, VLLM)
    families = schema.families()
    snapshots: dict[tuple[str, str], Snapshot] = {}
    for family in text_string_to_metric_families(text):
        # The text format declares `<name>_created` as a gauge family of its own.
        name = family.name.removesuffix("_created")
        if name not in families:
            continue
        for sample in family.samples:
            key = (sample.labels.get(schema.model_label, ""), sample.labels.get(schema.rank_label, ""))
            snap = snapshots.setdefault(key, Snapshot())
            snap.speculating |= name in schema.spec_families
            _take(snap, schema, name, sample)
    for snap in snapshots.values():
        snap.speculating |= not schema.spec_families and snap.counters.get("drafts", 0.0) > 0
    return snapshots


def _take(snap: Snapshot, schema: EngineSchema, family: str, sample) -> None:
    suffix = sample.name[len(family) :] or "_total"  # a counter named without `_total` (llama.cpp PR #26389)
    if suffix == "_created":
        # one timestamp per series: a series that appears later (SGLang's is_streaming="true") is no restart
        snap.created[family + repr(sorted(sample.labels.items()))] = sample.value
    elif family in schema.counters and suffix == "_total":
        _add(snap.counters, schema.counters[family], sample.value)
    elif family == schema.per_position and suffix == "_total":
        _add(snap.per_position, int(sample.labels[schema.position_label]), sample.value)
        if schema.drafted_per_position:
            _add(snap.counters, "accepted_tokens", sample.value)
    elif family == schema.drafted_per_position and suffix == "_total":
        _add(snap.counters, "draft_tokens", sample.value)
        if int(sample.labels[schema.position_label]) == 0:
            _add(snap.counters, "drafts", sample.value)
    elif family in schema.histograms and suffix == "_bucket":
        _add(snap.buckets.setdefault(schema.histograms[family], {}), float(sample.labels["le"]), sample.value)
    elif family in schema.histograms and suffix == "_sum":
        _add(snap.sums, schema.histograms[family], sample.value)


def _add(totals: dict, key, value: float) -> None:
    totals[key] = totals.get(key, 0.0) + value


def is_reset(previous: Snapshot, current: Snapshot) -> bool:
    if any(current.created.get(k, v) != v for k, v in previous.created.items()):
        return True
    pairs = [
        (previous.counters, current.counters),
        (previous.per_position, current.per_position),
        (previous.sums, current.sums),
    ]
    pairs += [(previous.buckets.get(h, {}), current.buckets.get(h, {})) for h in HISTOGRAMS.values()]
    return any(now < before.get(k, 0.0) for before, after in pairs for k, now in after.items())


def delta(
    previous: Snapshot,
    current: Snapshot,
    source: str,
    key: tuple[str, str],
    at: float,
    interval_s: float,
    schema: EngineSchema = VLLM,
) -> dict:
    """A `vllm_scrapes` row (every engine's): what happened between two snapshots."""
    reset = is_reset(previous, current)
    base = Snapshot() if reset else previous

    def diff(now: dict, before: dict, k) -> float:
        return max(0.0, now.get(k, 0.0) - before.get(k, 0.0))

    row = {
        "source": source,
        "model": key[0],
        "engine": key[1],
        "at": at,
        "interval_s": interval_s,
        "counter_reset": reset,
        "speculating": current.speculating,
    }
    row.update(schema.columns({name: diff(current.counters, base.counters, name) for name in current.counters}))
    positions = range(max(current.per_position, default=-1) + 1)
    row["accepted_per_position"] = [diff(current.per_position, base.per_position, p) for p in positions]
    for hist in HISTOGRAMS.values():
        bounds = sorted(current.buckets.get(hist, {}))
        cumulative = [diff(current.buckets.get(hist, {}), base.buckets.get(hist, {}), le) for le in bounds]
        row[f"{hist}_bounds"] = [b for b in bounds if math.isfinite(b)]
        row[f"{hist}_counts"] = np.diff([0.0, *cumulative]).clip(min=0).tolist()
        row[f"{hist}_sum"] = diff(current.sums, base.sums, hist)
    return row


class Scraper:
    """Polls one vLLM /metrics URL and stores a delta row per (model, engine) per interval."""

    def __init__(self, url: str, db: Engine, interval_s: float) -> None:
        self.url, self.db, self.interval_s = url, db, interval_s
        self._last: dict[tuple[str, str], tuple[float, Snapshot]] = {}
        self.down_since: float | None = None  # epoch s of the first failed scrape of the current outage

    def observe(self, text: str, at: float) -> list[dict]:
        """Turn one scrape into delta rows (stored) and remember it as the next baseline."""
        rows, schema = [], schema_for(text, OTHER_ENGINES, VLLM)
        for key, snap in parse(text, schema).items():
            if key in self._last:
                before_at, before = self._last[key]
                rows.append(delta(before, snap, self.url, key, at, at - before_at, schema))
            self._last[key] = (at, snap)
        if rows:
            with write_transaction(self.db) as conn:
                conn.execute(insert(VllmScrape), rows)
        return rows

    async def scrape(self, http: httpx.AsyncClient) -> list[dict]:
        """One poll. A failure keeps the baseline: the next good scrape's row spans the gap
        (`interval_s`), and a restart meanwhile shows as a counter reset. Logged once per outage."""
        try:
            response = await http.get(self.url)
            response.raise_for_status()
            rows = await asyncio.to_thread(self.observe, response.text, time.time())
        except Exception as exc:  # noqa: BLE001 - a down vLLM must not stop the collector
            if self.down_since is None:
                self.down_since = time.time()
                log.warning(
                    "scraping %s failed: %s (retrying every %g s; the gap is recorded as one interval)",
                    self.url,
                    exc,
                    self.interval_s,
                )
            return []
        if self.down_since is not None:
            log.warning(
                "scraping %s works again after %.0f s%s",
                self.url,
                time.time() - self.down_since,
                " (vLLM restarted: counters reset)" if any(r["counter_reset"] for r in rows) else "",
            )
            self.down_since = None
        return rows

    async def run(self) -> None:
        async with httpx.AsyncClient(timeout=min(10.0, self.interval_s)) as http:
            while True:
                await self.scrape(http)
                await asyncio.sleep(self.interval_s)


@dataclass(frozen=True)
class VllmSignals:
    """Spec-decode and latency figures of vLLM sources over a window (from scrape deltas)."""

    intervals: int
    drafts: float
    draft_tokens: float
    accepted_tokens: float
    acceptance_rate: float | None
    mean_acceptance_length: float | None
    per_position: list[float]
    ttft: Percentiles
    e2e: Percentiles
    generation_tokens: float = 0.0
    speculating: bool = False  # some row in the window exposed the spec-decode families
    # other acceptance definitions (telemetry/ratios.py): position 0 (vLLM's per-position counters are
    # unconditional: position 0 is the one conditional share), and mean length / (k + 1), k the positions
    conditional_acceptance: float | None = None
    acceptance_length_ratio: float | None = None

    @property
    def drafted_step_fraction(self) -> float | None:
        """Share of decode steps that drafted (collector.reads.speculation); None without tokens."""
        return ratios.drafted_step_fraction(self.drafts, self.accepted_tokens, self.generation_tokens)


def vllm_signals(db: Engine, window: Window, source: str | None = None, model: str | None = None) -> VllmSignals:
    stmt = select(VllmScrape).where(VllmScrape.at >= window.start, VllmScrape.at < window.end).order_by(VllmScrape.at)
    if source is not None:
        stmt = stmt.where(VllmScrape.source == source)
    if model is not None:
        stmt = stmt.where(VllmScrape.model == model)
    with db.connect() as conn:
        rows = conn.execute(stmt).mappings().all()
    drafts, drafted, accepted = (float(sum(r[c] for r in rows)) for c in ("drafts", "draft_tokens", "accepted_tokens"))
    width = max((len(r["accepted_per_position"]) for r in rows), default=0)
    per_pos = np.zeros(width)
    for r in rows:
        per_pos[: len(r["accepted_per_position"])] += r["accepted_per_position"]
    return VllmSignals(
        len(rows),
        drafts,
        drafted,
        accepted,
        ratios.acceptance_rate(accepted, drafted),
        ratios.mean_acceptance_length(accepted, drafts),
        (per_pos / drafts).tolist() if drafts else [],
        _histogram_percentiles(rows, "ttft"),
        _histogram_percentiles(rows, "e2e"),
        float(sum(r["generation_tokens"] for r in rows)),
        any(r["speculating"] for r in rows),
        ratios.conditional_acceptance(per_pos[0], drafts) if width else None,
        ratios.acceptance_length_ratio(accepted, drafts, width),
    )


def _histogram_percentiles(rows, hist: str) -> Percentiles:
    """histogram_quantile over the summed bucket deltas (rows with the newest bucket layout)."""
    if not rows:
        return Percentiles()
    bounds = rows[-1][f"{hist}_bounds"]
    same = [
        r[f"{hist}_counts"]
        for r in rows
        if r[f"{hist}_bounds"] == bounds and len(r[f"{hist}_counts"]) == len(bounds) + 1
    ]
    counts = np.sum(same, axis=0) if same else np.zeros(len(bounds) + 1)
    if not counts.sum():
        return Percentiles()
    p50, p90, p95, p99 = (histogram_quantile(q, counts, bounds) for q in (0.5, 0.9, 0.95, 0.99))
    return Percentiles(p50, p90, p95, p99, int(counts.sum()))
