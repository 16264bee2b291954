"""What the cost model reads from the store, as numpy columns and frozen rows (no ORM row leaves here).

    request_usage(db, window, filters)      requests whose life overlaps the window, one array per column
    gateway_lives(db, window, instances)    every gateway record at those upstreams whose life overlaps the
                                                window, whatever the filters (cost.sharing's population)
    power_rows(db, window, filters)         (instance, at, power_w, power_source) of device samples
    memory_rows(db, window, filters)        (instance, mem_reserved_bytes, draft_loaded) of device samples
    freed_by_unloads(db, window, filters)   `draft_unloaded` event details (bytes freed)
    store_growth(db, window)                rows stored in total and in the window, and the database's size
    device_counts(db, window)               device name -> samples in the window
    instance_devices(db, window, filters)   (instance, device name, samples) in the window
    scenario_rows(db, window, filters)      the advisor's per-request columns
    peak_memory(db, window)                 instance -> peak reserved bytes

A request straddling the window's start is read when it started at most `STRADDLE_S` before it and
was still running inside the window: the cost model charges it by its overlap.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from sqlalchemy import Engine, and_, case, func, literal, select, text, true

from specwatch.collector.models import DeviceSampleRow, EngineEventRow, Request
from specwatch.collector.reads.queries import Filters, Window
from specwatch.telemetry.schema import GATEWAY_TAG

STRADDLE_S = 3600.0  # how far before the window a request may have started and still be read
GATEWAY_SOURCE = "processor_sharing"  # the device_s_source of a gateway's records
_GATEWAY = Request.tags[GATEWAY_TAG].as_string()
_REQUEST_COLUMNS = {
    "instance": Request.instance,
    "mode": Request.mode,
    "drafter": Request.drafter,
    "started_at": Request.started_at,
    "queue_s": Request.queue_s,
    "ttft_s": Request.ttft_s,
    "e2e_s": Request.e2e_s,
    "status": Request.status,
    "output_tokens": Request.output_tokens,
    "retries": Request.retries,
    "device_s": Request.device_s,
    "device_s_source": Request.device_s_source,
    "failed_device_s": Request.failed_device_s,
    "energy_j": Request.energy_j,
    "energy_source": Request.energy_source,
    "drafts": Request.num_drafts,
    "draft_tokens": Request.num_draft_tokens,
    "accepted_tokens": Request.num_accepted_tokens,
    "draft_s": Request.draft_s,
    "verify_s": Request.verify_s,
    "gateway": _GATEWAY,
}
_TEXT = ("instance", "mode", "drafter", "status", "device_s_source", "energy_source", "gateway")
_NULLABLE = ("device_s", "energy_j", "ttft_s", "failed_device_s")  # NULL -> NaN


class RequestColumns:
    """Stored requests, one numpy array per column (all statuses: failed work costs device time too)."""

    def __init__(self, rows: list[tuple]) -> None:
        columns = list(zip(*rows)) if rows else [()] * (len(_REQUEST_COLUMNS) + 1)
        for name, values in zip(_REQUEST_COLUMNS, columns):
            if name in _TEXT:
                array = np.asarray(values, dtype=object)
            elif name in _NULLABLE:
                array = np.array([np.nan if v is None else v for v in values], dtype=float)
            else:
                array = np.asarray(values, dtype=float)
            setattr(self, name, array)
        self.ok = self.status == "ok"
        self.in_view = np.asarray(columns[len(_REQUEST_COLUMNS)] if rows else (), dtype=bool)

    def take(self, rows: np.ndarray) -> RequestColumns:
        """These rows only (a boolean mask or indices)."""
        taken = object.__new__(RequestColumns)
        taken.__dict__ = {name: values[rows] for name, values in self.__dict__.items()}
        return taken

    def __len__(self) -> int:
        return len(self.started_at)


def request_usage(
    db: Engine, window: Window, filters: Filters = Filters(), view: Filters | None = None
) -> RequestColumns:
    """Requests whose life [started_at, started_at + e2e_s] overlaps `window` (see the module docstring);
    with `view`, each row's `in_view` says whether the view's conditions hold for it."""
    marks = [case((and_(true(), *view.conditions()), True), else_=False)] if view else [literal(True)]
    stmt = _overlapping(select(*_REQUEST_COLUMNS.values(), *marks), window, filters)
    with db.connect() as conn:
        return RequestColumns(conn.execute(stmt).all())


def _overlapping(stmt, window: Window, filters: Filters):
    wide = Window(window.start - STRADDLE_S, window.end)
    return filters.apply(stmt, wide).where(Request.started_at + Request.e2e_s >= window.start)


@dataclass(frozen=True)
class GatewayLives:
    """Gateway records (device_s_source processor_sharing), one array entry each."""

    instance: np.ndarray  # str: the upstream
    gateway: np.ndarray  # str: the gateway's name ("" when its records carry no gateway tag)
    started_at: np.ndarray
    queue_s: np.ndarray
    e2e_s: np.ndarray


def gateway_lives(db: Engine, window: Window, instances: list[str]) -> GatewayLives:
    """Every gateway record at `instances` whose life overlaps `window` (no other filter): who was in flight."""
    columns = (Request.instance, _GATEWAY, Request.started_at, Request.queue_s, Request.e2e_s)
    stmt = _overlapping(select(*columns), window, Filters())
    stmt = stmt.where(Request.device_s_source == GATEWAY_SOURCE, Request.instance.in_(instances))
    with db.connect() as conn:
        rows = conn.execute(stmt).all() if instances else []
    names, gateways, *times = zip(*rows) if rows else ((), (), (), (), ())
    text = [np.asarray(names, dtype=object), np.asarray([g or "" for g in gateways], dtype=object)]
    return GatewayLives(*text, *(np.asarray(t, dtype=float) for t in times))


def _samples(columns, window: Window, filters: Filters):
    stmt = select(*columns).where(DeviceSampleRow.at >= window.start, DeviceSampleRow.at < window.end)
    return stmt if filters.instance is None else stmt.where(DeviceSampleRow.instance == filters.instance)


def power_rows(db: Engine, window: Window, filters: Filters = Filters()) -> list[tuple]:
    """(instance, at, power_w, power_source) per device sample in the window."""
    columns = (DeviceSampleRow.instance, DeviceSampleRow.at, DeviceSampleRow.power_w, DeviceSampleRow.power_source)
    with db.connect() as conn:
        return [tuple(row) for row in conn.execute(_samples(columns, window, filters))]


def memory_rows(db: Engine, window: Window, filters: Filters = Filters()) -> list[tuple]:
    """(instance, mem_reserved_bytes, draft_loaded) per device sample in the window."""
    columns = (DeviceSampleRow.instance, DeviceSampleRow.mem_reserved_bytes, DeviceSampleRow.draft_loaded)
    with db.connect() as conn:
        return [tuple(row) for row in conn.execute(_samples(columns, window, filters))]


def freed_by_unloads(db: Engine, window: Window, filters: Filters = Filters()) -> list[dict]:
    """The `detail` of each `draft_unloaded` event in the window."""
    stmt = select(EngineEventRow.detail).where(
        EngineEventRow.kind == "draft_unloaded", EngineEventRow.at >= window.start, EngineEventRow.at < window.end
    )
    if filters.instance is not None:
        stmt = stmt.where(EngineEventRow.instance == filters.instance)
    with db.connect() as conn:
        return [detail or {} for (detail,) in conn.execute(stmt)]


@dataclass(frozen=True)
class StoreGrowth:
    total_rows: int  # requests, samples and events stored
    window_rows: int  # of those, in the window
    first_at: float | None  # the earliest of them in the window
    size_bytes: float | None  # the database's size (None: unknown dialect)


def store_growth(db: Engine, window: Window) -> StoreGrowth:
    tables = (Request.__table__, DeviceSampleRow.__table__, EngineEventRow.__table__)
    times = (Request.started_at, DeviceSampleRow.at, EngineEventRow.at)
    with db.connect() as conn:
        total = sum(conn.execute(select(func.count()).select_from(t)).scalar() for t in tables)
        found = [
            conn.execute(select(func.count(), func.min(c)).where(c >= window.start, c < window.end)).one()
            for c in times
        ]
        size = _database_bytes(conn)
    starts = [lo for n, lo in found if n]
    return StoreGrowth(int(total), int(sum(n for n, _ in found)), min(starts) if starts else None, size)


def _database_bytes(conn) -> float | None:
    if conn.dialect.name == "sqlite":
        return float(conn.execute(text("PRAGMA page_count")).scalar() * conn.execute(text("PRAGMA page_size")).scalar())
    if conn.dialect.name == "postgresql":
        return float(conn.execute(text("SELECT pg_database_size(current_database())")).scalar())
    return None


def device_counts(db: Engine, window: Window) -> list[tuple[str, int]]:
    """(device name, samples) in the window, most sampled first."""
    stmt = (
        select(DeviceSampleRow.device, func.count())
        .where(DeviceSampleRow.at >= window.start, DeviceSampleRow.at < window.end)
        .group_by(DeviceSampleRow.device)
    )
    with db.connect() as conn:
        return sorted(((d, int(n)) for d, n in conn.execute(stmt)), key=lambda row: -row[1])


def instance_devices(db: Engine, window: Window, filters: Filters = Filters()) -> list[tuple[str, str, int]]:
    """(instance, device name, samples) in the window, most sampled first."""
    columns = (DeviceSampleRow.instance, DeviceSampleRow.device, func.count())
    stmt = _samples(columns, window, filters).group_by(DeviceSampleRow.instance, DeviceSampleRow.device)
    with db.connect() as conn:
        return sorted(((i, d, int(n)) for i, d, n in conn.execute(stmt)), key=lambda row: -row[2])


SCENARIO_TAGS = ("scenario", "temperature", "sampling", "determinism", "latency")


def scenario_rows(db: Engine, window: Window, filters: Filters = Filters()) -> dict[str, np.ndarray]:
    """The advisor's columns (one object array each) of the requests started in the window."""
    columns = (
        Request.mode,
        Request.drafter,
        Request.arm,
        Request.instance,
        Request.status,
        (Request.prompt_tokens + Request.output_tokens).label("context"),
        Request.ttft_s,
        Request.e2e_s,
        Request.output_tokens,
        Request.num_draft_tokens,
        Request.num_accepted_tokens,
        Request.load_at_admission,
        *(Request.tags[key].as_string().label(key) for key in SCENARIO_TAGS),
    )
    with db.connect() as conn:
        result = conn.execute(filters.apply(select(*columns), window))
        names, rows = list(result.keys()), result.all()
    if not rows:
        return {}
    return {name: np.array(column, dtype=object) for name, column in zip(names, zip(*rows))}


def peak_memory(db: Engine, window: Window) -> dict[str, float]:
    """Instance -> peak mem_reserved_bytes of its device samples in the window."""
    stmt = (
        select(DeviceSampleRow.instance, func.max(DeviceSampleRow.mem_reserved_bytes))
        .where(DeviceSampleRow.at >= window.start, DeviceSampleRow.at < window.end)
        .group_by(DeviceSampleRow.instance)
    )
    with db.connect() as conn:
        return {instance: float(peak) for instance, peak in conn.execute(stmt)}
