"""What the speculation tuner (`cost.tuner_data`) reads from the store, as frozen numpy columns.

    tuning_rows(db, window, filters)     ok requests that started in the window: timings, draft
                                             counts, per-position acceptance and the drafts that
                                             reached each position (K-wide matrices)
    version_markers(db, window, filters) `config` events that name a version: (instance, at, version)

Requests whose draft counts the producer could not see (`draft_counts_known` false) keep their timings
(`counts_known` false) so the step-cost model can use them; the acceptance model skips them. At most
`MAX_ROWS` requests are read: the newest ones.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sqlalchemy import Engine, select

from specwatch.collector.models import EngineEventRow, Request
from specwatch.collector.reads.queries import Filters, Window

MAX_ROWS = 200_000
VERSION_KEYS = ("version", "vllm_version", "upstream_version")  # in a `config` event's detail, first found wins
_COLUMNS = (
    Request.instance, Request.mode, Request.drafter, Request.started_at, Request.queue_s, Request.ttft_s,
    Request.e2e_s, Request.output_tokens, Request.num_drafts, Request.num_draft_tokens,
    Request.num_accepted_tokens, Request.gamma, Request.verify_s, Request.draft_s, Request.draft_counts_known,
    Request.accepted_per_position, Request.drafts_per_position,
)  # fmt: skip


@dataclass(frozen=True)
class TuningRows:
    """One entry per request (arrays of equal length); `per_position` is n x K (K the largest gamma)."""

    instance: np.ndarray  # object
    drafter: np.ndarray  # object (None: plain)
    speculative: np.ndarray  # bool
    started_at: np.ndarray
    queue_s: np.ndarray
    ttft_s: np.ndarray  # NaN: unknown
    e2e_s: np.ndarray
    output_tokens: np.ndarray
    drafts: np.ndarray
    draft_tokens: np.ndarray
    accepted: np.ndarray
    gamma: np.ndarray  # int
    verify_s: np.ndarray
    draft_s: np.ndarray
    counts_known: np.ndarray  # bool
    per_position: np.ndarray  # float, n x K
    # drafts that reached each position, n x K: the producer's count (`drafts_per_position`) where it sent
    # one (`reach_counted`), else every draft taken to reach the request's gamma
    reach: np.ndarray
    reach_counted: np.ndarray  # bool

    def __len__(self) -> int:
        return len(self.started_at)


def tuning_rows(db: Engine, window: Window, filters: Filters = Filters()) -> TuningRows:
    """The window's ok requests (module docstring), oldest first."""
    stmt = filters.apply(select(*_COLUMNS), window).where(Request.status == "ok")
    stmt = stmt.order_by(Request.started_at.desc()).limit(MAX_ROWS)
    with db.connect() as conn:
        rows = conn.execute(stmt).all()[::-1]
    return rows_from_tuples([tuple(r) for r in rows])


def rows_from_tuples(rows: list[tuple]) -> TuningRows:
    """TuningRows from tuples in `_COLUMNS` order (the store's rows, or a test's)."""
    cols = list(zip(*rows)) if rows else [()] * len(_COLUMNS)

    def floats(i: int) -> np.ndarray:
        return np.array([np.nan if v is None else v for v in cols[i]], dtype=float)

    positions = [list(p or ()) for p in cols[15]]
    width = max((len(p) for p in positions), default=0)
    matrix, reach = np.zeros((len(positions), width)), np.zeros((len(positions), width))
    counted = np.array([bool(r) for r in cols[16]], dtype=bool)
    for i, (p, reached) in enumerate(zip(positions, cols[16])):
        matrix[i, : len(p)] = p
        reach[i, : len(p)] = reached if reached else [cols[8][i]] * len(p)
    return TuningRows(
        np.asarray(cols[0], dtype=object), np.asarray(cols[2], dtype=object),
        np.asarray([m == "speculative" for m in cols[1]], dtype=bool), *(floats(i) for i in range(3, 11)),
        np.asarray(cols[11], dtype=int), floats(12), floats(13), np.asarray(cols[14], dtype=bool), matrix, reach,
        counted,
    )  # fmt: skip


def version_markers(db: Engine, window: Window, filters: Filters = Filters()) -> tuple[tuple[str, float, str], ...]:
    """(instance, at, version) of the `config` events up to the window's end that name a version, oldest first.

    A marker a tenant-bound token wrote (its detail names the tenant) counts only where the filters ask
    for that tenant (`tag=tenant:NAME`): one tenant's deploy must not mark the fleet-wide plan stale."""
    stmt = select(EngineEventRow.instance, EngineEventRow.at, EngineEventRow.detail).where(
        EngineEventRow.kind == "config", EngineEventRow.at < window.end
    )
    if filters.instance is not None:
        stmt = stmt.where(EngineEventRow.instance == filters.instance)
    with db.connect() as conn:
        found = conn.execute(stmt.order_by(EngineEventRow.at)).all()
    tenant = dict(filters.tags).get("tenant")
    return tuple(
        (i, float(at), v)
        for i, at, detail in found
        if (v := _version(detail)) is not None and _marker_tenant(detail) in (None, tenant)
    )


def _marker_tenant(detail) -> str | None:
    return detail.get("tenant") if isinstance(detail, dict) else None


def data_parallel_ranks(db: Engine, window: Window, filters: Filters = Filters()) -> int:
    """The most data-parallel ranks (`data_parallel_ranks`, the engines an upstream's /metrics reports: the
    gateway's markers) among the latest `config` event of each (filtered) instance up to the window's end;
    1 when none says."""
    stmt = select(EngineEventRow.instance, EngineEventRow.detail).where(
        EngineEventRow.kind == "config", EngineEventRow.at < window.end
    )
    if filters.instance is not None:
        stmt = stmt.where(EngineEventRow.instance == filters.instance)
    with db.connect() as conn:
        latest = dict(conn.execute(stmt.order_by(EngineEventRow.at)).all())
    ranks = [d.get("data_parallel_ranks") for d in latest.values() if isinstance(d, dict)]
    return max((r for r in ranks if type(r) is int), default=1)


def _version(detail) -> str | None:
    if not isinstance(detail, dict):
        return None
    return next((str(detail[k])[:64] for k in VERSION_KEYS if isinstance(detail.get(k), (str, int, float))), None)
