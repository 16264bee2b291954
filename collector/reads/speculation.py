"""Is speculation drafting at all? Drafts compared with generated tokens, per instance configured to speculate.

An engine can be configured to speculate and still draft nothing: vLLM steps sent to k = 0 (a
per-batch-size schedule entry) increment no spec-decode counter and are left out of the per-request
histogram, TensorRT-LLM's `acceptance_rate_threshold` turns drafting off for good. Acceptance then
still reads whatever the last drafts gave, so it cannot tell "drafting is healthy" from "drafting
stopped". This module can:

    drafted step fraction = drafts / (generated tokens - accepted tokens)

A decode step that drafts yields its accepted tokens plus the target's own, a step that does not
yields one, so `generated - accepted` counts the (per-request) decode steps and `drafts` those that
drafted. Speculation is *inactive* where the fraction over the window is below `min_fraction` while
tokens were generated; no traffic is not inactivity (the fraction is None).

"Configured to speculate" comes from three places, each an `evidence` of the `Activity`:
- `records`: request records in `speculative` mode (the engine's, or the gateway's for a vLLM
  upstream with a speculative config);
- `scrape`: a scraped exposition carrying the spec-decode counter families (vLLM registers them
  only with a speculative config); the scrape's source URL is the instance;
- `config`: the instance's latest config event names a drafter or a non-zero number of
  speculative tokens (the engine's and the gateway's upstream markers).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from sqlalchemy import Engine, func, select

from specwatch.collector.models import EngineEventRow, Request, VllmScrape
from specwatch.collector.reads.acceptance_modes import flagged_instances
from specwatch.collector.reads.queries import Window
from specwatch.telemetry.ratios import drafted_step_fraction

DEFAULT_MIN_FRACTION = 0.05  # below this share of decode steps drafting, speculation is inactive
MIN_STEPS = 32  # decode steps a window needs before it can call speculation inactive
RECENT_S = 120.0  # the stretch before a window's end that says whether speculation drafts *now*


def recent(window: Window) -> Window:
    """The last RECENT_S of `window`: an acceptance over `window` is stale where this part is inactive."""
    return Window(max(window.start, window.end - RECENT_S), window.end)


LOOKBACK_S = 86400.0  # how far back `last_drafted_at` and config events are looked for


@dataclass(frozen=True)
class Activity:
    """Drafting over one window of one instance configured to speculate."""

    instance: str  # a record's instance, or a scrape's source URL
    evidence: tuple[str, ...]  # 'config', 'records', 'scrape': what says it is configured to speculate
    generated_tokens: float
    drafts: float
    accepted_tokens: float
    steps: float  # decode steps: generated - accepted tokens
    drafted_step_fraction: float | None  # None: no tokens generated in the window
    inactive: bool
    last_drafted_at: float | None  # epoch s of the last draft seen within LOOKBACK_S (when it stopped)
    acceptance_mode: str | None = None  # 'lossy' | 'forced' (collector.reads.acceptance_modes); None: as measured


def speculation_activity(db: Engine, window: Window, min_fraction: float = DEFAULT_MIN_FRACTION) -> list[Activity]:
    """One `Activity` per instance configured to speculate (records, scrapes or config), by instance."""
    counts: dict[str, list[float]] = {}  # instance -> [generated, drafts, accepted]
    evidence: dict[str, set[str]] = {}
    for (instance,), totals in record_counts(db, window).items():
        counts[instance] = totals
        evidence.setdefault(instance, set()).add("records")
    for source, totals in _scrape_counts(db, window).items():
        counts[source] = [a + b for a, b in zip(counts.get(source, [0.0, 0.0, 0.0]), totals)]
        evidence.setdefault(source, set()).add("scrape")
    for instance in _configured_by_events(db, window):
        evidence.setdefault(instance, set()).add("config")
    modes = flagged_instances(db, window.end)
    return [
        replace(
            _activity(db, window, name, tuple(sorted(evidence[name])), counts.get(name), min_fraction),
            acceptance_mode=modes.get(name),
        )
        for name in sorted(evidence)
    ]


def _activity(db, window, name: str, evidence, totals, min_fraction: float) -> Activity:
    generated, drafts, accepted = totals or (0.0, 0.0, 0.0)
    fraction = drafted_step_fraction(drafts, accepted, generated)
    last = _last_drafted_at(db, name, window.end)
    steps = max(0.0, generated - accepted)
    return Activity(
        name,
        evidence,
        generated,
        drafts,
        accepted,
        steps,
        fraction,
        is_inactive(drafts, accepted, generated, min_fraction),
        last,
    )


def is_inactive(drafts: float, accepted: float, generated: float, min_fraction: float = DEFAULT_MIN_FRACTION) -> bool:
    """Enough decode steps (MIN_STEPS) of which fewer than `min_fraction` drafted."""
    fraction = drafted_step_fraction(drafts, accepted, generated)
    return fraction is not None and generated - accepted >= MIN_STEPS and fraction < min_fraction


def record_counts(db: Engine, window: Window, group_by: Sequence[str] = ("instance",)) -> dict[tuple, list[float]]:
    """(output tokens, drafts, accepted tokens) of the window's speculative-mode requests whose draft counts
    the producer saw (`draft_counts_known`: a vLLM answer without per-request metrics says nothing about
    drafting), per label set of `group_by` (Request columns). Raw rows: the aggregates do not keep
    `draft_counts_known`."""
    r = Request
    labels = [getattr(r, g) for g in group_by]
    sums = (func.sum(r.output_tokens), func.sum(r.num_drafts), func.sum(r.num_accepted_tokens))
    stmt = (
        select(*labels, *sums)
        .where(r.started_at >= window.start, r.started_at < window.end, r.mode == "speculative")
        .where(r.draft_counts_known.is_(True))
        .group_by(*labels)
    )
    k = len(group_by)
    with db.connect() as conn:
        return {tuple(row[:k]): [float(v or 0.0) for v in row[k:]] for row in conn.execute(stmt)}


def _scrape_counts(db: Engine, window: Window) -> dict[str, list[float]]:
    """(generated tokens, drafts, accepted tokens) of speculating scrape sources, every engine rank summed."""
    s = VllmScrape
    stmt = (
        select(s.source, func.sum(s.generation_tokens), func.sum(s.drafts), func.sum(s.accepted_tokens))
        .where(s.at >= window.start, s.at < window.end, s.speculating.is_(True))
        .group_by(s.source)
    )
    with db.connect() as conn:
        return {row[0]: [float(v or 0.0) for v in row[1:]] for row in conn.execute(stmt)}


def _configured_by_events(db: Engine, window: Window) -> list[str]:
    """Instances whose latest config event (within LOOKBACK_S of the window's end) says they speculate."""
    e = EngineEventRow
    stmt = (
        select(e.instance, e.detail)
        .where(e.kind == "config", e.at >= window.end - LOOKBACK_S, e.at < window.end)
        .order_by(e.at)
    )
    with db.connect() as conn:
        latest = {instance: detail for instance, detail in conn.execute(stmt)}
    return [instance for instance, detail in latest.items() if speculates(detail)]


def speculates(detail: dict) -> bool:
    """A config event's verdict: a drafter other than none, or a positive number of speculative tokens."""
    drafter = detail.get("drafter")
    tokens = detail.get("num_speculative_tokens")
    return (isinstance(drafter, str) and drafter not in ("", "none")) or (
        isinstance(tokens, int | float) and not isinstance(tokens, bool) and tokens > 0
    )


def _last_drafted_at(db: Engine, name: str, end: float) -> float | None:
    """The latest moment `name` drafted (a request's end, or a scrape), within LOOKBACK_S before `end`."""
    since = end - LOOKBACK_S
    r, s = Request, VllmScrape
    request_end = func.max(r.started_at + func.coalesce(r.e2e_s, 0.0))
    queries = (
        select(request_end).where(r.instance == name, r.num_drafts > 0, r.started_at >= since, r.started_at < end),
        select(func.max(s.at)).where(s.source == name, s.drafts > 0, s.at >= since, s.at < end),
    )
    with db.connect() as conn:
        found = [conn.execute(q).scalar() for q in queries]
    return max((float(v) for v in found if v is not None), default=None)


def inactive_instances(activities: Iterable[Activity]) -> set[str]:
    return {a.instance for a in activities if a.inactive}
