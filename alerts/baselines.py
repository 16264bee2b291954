"""The drift pass on the leader: feed each new drafted request to its series' detector (`alerts.drift`)
and persist every changed series, with the pass's cursor, in one transaction.

A series is (model, drafter, instance, tag): the value of the first of `tag_keys` (scenario, tenant)
the request carries, else "none". At most `max_series` series are tracked (a new one past that is
ignored and counted), which also bounds the labels of `specwatch_acceptance_drift_score`.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass

from sqlalchemy import Engine

from specwatch.alerts.detector_settings import DriftSettings
from specwatch.alerts.detector_store import Labels, SeriesRow, cursor, save_cursor, save_rows, series_rows
from specwatch.alerts.drift import SeriesState, step
from specwatch.collector.db import write_transaction
from specwatch.collector.reads.acceptance_modes import flagged_instances
from specwatch.collector.reads.detector_reads import DraftedRequest, cursor_start, drafted_since

log = logging.getLogger("specwatch.alerts")
KIND = "drift"


@dataclass(frozen=True)
class DriftPass:
    read: int  # drafted requests read
    fed: int  # of those, fed to a detector
    series: int  # series updated
    untracked: int  # requests of series past max_series


def series_labels(r: DraftedRequest, settings: DriftSettings) -> Labels:
    tag = next((r.tags[k] for k in settings.tag_keys if k in (r.tags or {})), "none")
    return (("drafter", r.drafter or "none"), ("instance", r.instance), ("model", r.model), ("tag", str(tag)))


def to_row(labels: Labels, state: SeriesState, settings: DriftSettings) -> SeriesRow:
    annotations = {
        "baseline": f"{state.mean:.3f}",
        "ewma": f"{state.ewma:.3f}" if state.ewma is not None else "",
        "change": f"{state.relative_change():+.1%}",
        "stddev": f"{state.stddev():.3f}",
    }
    warm = state.warmed_up(settings)
    return SeriesRow(KIND, labels, state.score(settings), state.n, warm, annotations, asdict(state), state.last_at)


def load_states(db: Engine) -> dict[Labels, SeriesState]:
    return {row.labels: SeriesState.load(row.state) for row in series_rows(db, KIND)}


def feed(
    states: dict[Labels, SeriesState], requests: tuple[DraftedRequest, ...], settings: DriftSettings
) -> tuple[set[Labels], int, int]:
    """Step each request's series (in place); returns the series changed, requests fed, requests untracked."""
    changed, fed, untracked = set(), 0, 0
    for r in requests:
        if r.drafted < settings.min_drafted_tokens:
            continue
        labels = series_labels(r, settings)
        if labels not in states and len(states) >= settings.max_series:
            untracked += 1
            continue
        states[labels] = step(states.get(labels, SeriesState()), r.acceptance, r.drafted, r.started_at, settings)
        changed.add(labels)
        fed += 1
    return changed, fed, untracked


def run_pass(db: Engine, settings: DriftSettings, now: float) -> DriftPass:
    """Read the requests after the cursor, step their series, save the changed ones and the cursor."""
    with db.connect() as conn:
        position = cursor(conn, KIND)
    if position is None:
        position = cursor_start(db, now - settings.initial_lookback)
    requests, last = drafted_since(db, position, settings.max_rows_per_cycle)
    flagged = flagged_instances(db, now)  # lossy or forced acceptance: no baseline to learn from
    states = load_states(db)
    changed, fed, untracked = feed(states, tuple(r for r in requests if r.instance not in flagged), settings)
    with write_transaction(db) as conn:
        save_rows(conn, [to_row(labels, states[labels], settings) for labels in changed])
        save_cursor(conn, KIND, last)
    if untracked:
        log.warning("drift: %d requests of series past max_series=%d not tracked", untracked, settings.max_series)
    return DriftPass(len(requests), fed, len(changed), untracked)
