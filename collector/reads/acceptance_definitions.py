"""The counts behind acceptance definitions other than the mean (telemetry/ratios.py): conditional
acceptance at position 0 needs the drafts whose first token was accepted, which only the per-position
lists carry (the per-second aggregates keep no per-position sums), so it is read from raw rows.

`definitions` serves the Acceptance page: the mean, position 0 and acceptance length / (k + 1) side by
side, per k (the mean falls as k grows, position 0 does not), with the instances whose acceptance is lossy
or forced named and why."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from sqlalchemy import Engine, select

from specwatch.collector.models import Request
from specwatch.collector.reads import acceptance_modes
from specwatch.collector.reads.queries import Filters, Population, Subset, Window, sample_rows
from specwatch.telemetry import ratios


def first_position_counts(db: Engine, window: Window, group_by: Sequence[str]) -> dict[tuple, tuple[float, float, int]]:
    """Per label set of `group_by` (Request columns): (drafts, drafts whose first token was accepted,
    requests) of the window's requests that drafted and report per-position counts."""
    r = Request
    stmt = select(*(getattr(r, g) for g in group_by), r.num_drafts, r.accepted_per_position).where(
        r.started_at >= window.start, r.started_at < window.end, r.num_drafts > 0, r.gamma > 0
    )
    found: dict[tuple, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    k = len(group_by)
    with db.connect() as conn:
        for row in conn.execute(stmt):
            totals = found[tuple(row[:k])]
            totals[0] += row[k]
            totals[1] += row[k + 1][0] if row[k + 1] else 0
            totals[2] += 1
    return {key: (drafts, first, int(n)) for key, (drafts, first, n) in found.items()}


@dataclass(frozen=True)
class Definitions:
    """One set of drafting steps read under each acceptance definition (telemetry/ratios.py), with the counts
    behind them: at one k (the records' gamma, the most draft tokens a step may propose) or over every k."""

    k: int | None  # None: every k of the window together (no one length ratio then, unless all share a k)
    requests: int
    drafts: int
    draft_tokens: int
    accepted_tokens: int
    first_position_accepted: int  # drafts whose first token was accepted
    acceptance_rate: float | None  # the mean: accepted / drafted tokens (vLLM's; the 0.6 rule's by default)
    conditional_acceptance: float | None  # position 0: first_position_accepted / drafts
    mean_acceptance_length: float | None
    acceptance_length_ratio: float | None  # mean acceptance length / (k + 1)


@dataclass(frozen=True)
class AcceptanceDefinitions:
    """`GET /v1/acceptance/definitions`: the window's acceptance under each definition, overall and per k,
    and the instances among its records whose acceptance is lossy or forced (`acceptance_modes`)."""

    overall: Definitions
    by_k: list[Definitions]
    flagged: list[acceptance_modes.Flag]
    sampled: Subset | None = None


def definitions(
    db: Engine, window: Window, filters: Filters = Filters(), population: Population | None = None
) -> AcceptanceDefinitions:
    """Over the window's requests that drafted with known per-position counts (a sample of a large window)."""
    r = Request
    stmt = select(
        r.gamma, r.instance, r.num_drafts, r.num_draft_tokens, r.num_accepted_tokens, r.accepted_per_position
    ).where(r.gamma > 0, r.num_drafts > 0)
    rows, sample = sample_rows(db, stmt, window, filters, population)
    per_k: dict[int, np.ndarray] = defaultdict(lambda: np.zeros(5, dtype=np.int64))
    for gamma, _, drafts, drafted, accepted, per_position in rows:
        per_k[gamma] += (1, drafts, drafted, accepted, per_position[0] if per_position else 0)
    by_k = [_definitions(k, counts) for k, counts in sorted(per_k.items())]
    total = sum(per_k.values(), np.zeros(5, dtype=np.int64))
    overall = _definitions(by_k[0].k if len(by_k) == 1 else None, total)
    flags = acceptance_modes.flags(db, window.end)
    seen = sorted({instance for _, instance, *_ in rows} & flags.keys())
    return AcceptanceDefinitions(overall, by_k, [flags[i] for i in seen], sample)


def _definitions(k: int | None, counts: np.ndarray) -> Definitions:
    requests, drafts, drafted, accepted, first = (int(c) for c in counts)
    return Definitions(
        k,
        requests,
        drafts,
        drafted,
        accepted,
        first,
        ratios.acceptance_rate(accepted, drafted),
        ratios.conditional_acceptance(first, drafts),
        ratios.mean_acceptance_length(accepted, drafts),
        None if k is None else ratios.acceptance_length_ratio(accepted, drafts, k),
    )
