"""SQL tables of the collector (SQLAlchemy 2 typed ORM).

Column names follow the telemetry contract in `telemetry.schema`; ORM rows never leave
the collector (queries return plain dataclasses). The Alembic migrations under
`collector/migrations` create exactly these tables, plus the alerts' own (`OTHER_PACKAGES_TABLES`,
defined in alerts/tables.py); `tests/collector/test_store.py` checks that the two agree.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    Double,
    Index,
    Integer,
    LargeBinary,
    MetaData,
    String,
    Text,
    UniqueConstraint,
    text,
    true,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from specwatch.telemetry.schema import LATENCY_BUCKETS

# SQLite only aliases rowid for INTEGER PRIMARY KEY, so BIGINT becomes INTEGER there.
BigId = BigInteger().with_variant(Integer(), "sqlite")


# per-request acceptance as the expression index ix_requests_acceptance holds it (NULL without drafts)
ACCEPTANCE_SQL = "(num_accepted_tokens * 1.0 / NULLIF(num_draft_tokens, 0))"

NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {
        float: Double(),
        dict[str, Any]: JSON(),
        list[int]: JSON(),
        list[float]: JSON(),
        dict[str, str]: JSON(),
    }


class Request(Base):
    """One finished request; `request_id` is the idempotency key."""

    __tablename__ = "requests"
    __table_args__ = (
        Index("ix_requests_started_at", "started_at"),
        Index("ix_requests_instance_started_at", "instance", "started_at"),
        Index("ix_requests_ttft_s_id", "ttft_s", "id"),  # the Requests listing's sorts (migration 0013)
        Index("ix_requests_e2e_s_id", "e2e_s", "id"),
        Index("ix_requests_acceptance", text(ACCEPTANCE_SQL), "id"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    request_id: Mapped[str] = mapped_column(String(128), unique=True)
    instance: Mapped[str] = mapped_column(String(128))
    model: Mapped[str] = mapped_column(String(128))
    drafter: Mapped[str | None] = mapped_column(String(256))
    mode: Mapped[str] = mapped_column(String(16))
    mode_reason: Mapped[str] = mapped_column(String(16))
    arm: Mapped[str | None] = mapped_column(String(8))
    started_at: Mapped[float]
    queue_s: Mapped[float]
    ttft_s: Mapped[float | None]
    e2e_s: Mapped[float]
    prompt_tokens: Mapped[int] = mapped_column(BigInteger)
    output_tokens: Mapped[int] = mapped_column(BigInteger)
    num_drafts: Mapped[int] = mapped_column(BigInteger)
    num_draft_tokens: Mapped[int] = mapped_column(BigInteger)
    num_accepted_tokens: Mapped[int] = mapped_column(BigInteger)
    accepted_per_position: Mapped[list[int]]
    gamma: Mapped[int] = mapped_column(Integer)
    drafts_per_position: Mapped[list[int]] = mapped_column(server_default="[]")  # empty: each draft reached gamma
    draft_s: Mapped[float]
    verify_s: Mapped[float]
    retries: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16))
    error: Mapped[str | None] = mapped_column(String(256))
    energy_j: Mapped[float | None]
    energy_source: Mapped[str | None] = mapped_column(String(16))
    load_at_admission: Mapped[float | None]
    tags: Mapped[dict[str, str]]
    draft_counts_known: Mapped[bool] = mapped_column(Boolean, server_default=true())
    mean_lookahead: Mapped[float | None]
    device_s: Mapped[float | None]
    device_s_source: Mapped[str | None] = mapped_column(String(24))
    failed_device_s: Mapped[float | None]  # of device_s: the failed attempts' (None: not measured)


class DeviceSampleRow(Base):
    """A periodic device reading; (instance, device, at) identifies it so a resend is a duplicate."""

    __tablename__ = "device_samples"
    __table_args__ = (
        UniqueConstraint("instance", "device", "at", name="uq_device_samples_instance_device_at"),
        Index("ix_device_samples_at", "at"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    instance: Mapped[str] = mapped_column(String(128))
    at: Mapped[float]
    device: Mapped[str] = mapped_column(String(128))
    mem_allocated_bytes: Mapped[int] = mapped_column(BigInteger)
    mem_reserved_bytes: Mapped[int] = mapped_column(BigInteger)
    fragmentation: Mapped[float | None]
    power_w: Mapped[float | None]
    power_source: Mapped[str | None] = mapped_column(String(16))
    util_target: Mapped[float | None]
    util_draft: Mapped[float | None]
    active_requests: Mapped[int] = mapped_column(BigInteger)
    queue_depth: Mapped[int] = mapped_column(BigInteger)
    load: Mapped[float | None]
    draft_loaded: Mapped[bool | None]
    default_mode: Mapped[str | None] = mapped_column(String(16))


class EngineEventRow(Base):
    """Something the engine did; (instance, kind, at) identifies it so a resend is a duplicate."""

    __tablename__ = "engine_events"
    __table_args__ = (
        UniqueConstraint("instance", "kind", "at", name="uq_engine_events_instance_kind_at"),
        Index("ix_engine_events_at", "at"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    instance: Mapped[str] = mapped_column(String(128))
    at: Mapped[float]
    kind: Mapped[str] = mapped_column(String(16))
    detail: Mapped[dict[str, Any]]
    duration_s: Mapped[float | None]


# The bounds of rollup rows written before migration 0005, a subset of LATENCY_BUCKETS. Such a
# row holds NULL in the buckets of the bounds it lacked (ADDED_BUCKETS): their observations are
# counted in the next bucket up, as a histogram without those bounds counts them.
LEGACY_LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 25.0, 60.0, 120.0)
ADDED_BUCKETS = tuple(i for i, bound in enumerate(LATENCY_BUCKETS) if bound not in LEGACY_LATENCY_BUCKETS)


def bucket_column_names(prefix: str) -> list[str]:
    """One column per bucket of LATENCY_BUCKETS, the last one above the largest bound."""
    return [f"{prefix}_b{i:02d}" for i in range(len(LATENCY_BUCKETS) + 1)]


def bucket_columns(prefix: str) -> dict[str, Any]:
    names = bucket_column_names(prefix)
    return {name: mapped_column(BigInteger, nullable=i in ADDED_BUCKETS) for i, name in enumerate(names)}


class _RollupColumns:
    """Aggregates of requests per period, kept long after raw rows are deleted.

    One row per (period_start, instance, model, mode, drafter, arm); '' stands for a null
    drafter or arm so the key is a plain primary key. Every other column is additive, so raw
    rows are folded in incrementally (`collector.tiers.rollups`). Latency histograms hold
    non-cumulative counts per bucket of `LATENCY_BUCKETS` (bucket i: bounds[i-1] < v <=
    bounds[i]; the last one: above the largest bound), one column each so SQL can SUM them;
    rows from before migration 0005 have NULL in the ADDED_BUCKETS (see LEGACY_LATENCY_BUCKETS).

    Since migration 0011 a row also holds DDSketches of TTFT, e2e and TPOT (`collector.tiers.sketch`, the
    per-second aggregates' kind), merged by the roll-up pass, and `sketched`: how many of its requests
    they cover. A row written before 0011 has `sketched` < `requests` (0, plus any late request folded
    in since): a sum that includes one reads its TTFT/e2e percentiles from the histograms (marked
    `basis="histogram"`) and has no TPOT.
    """

    period_start: Mapped[int] = mapped_column(BigInteger, primary_key=True)  # epoch seconds
    instance: Mapped[str] = mapped_column(String(128), primary_key=True)
    model: Mapped[str] = mapped_column(String(128), primary_key=True)
    mode: Mapped[str] = mapped_column(String(16), primary_key=True)
    drafter: Mapped[str] = mapped_column(String(256), primary_key=True)
    arm: Mapped[str] = mapped_column(String(8), primary_key=True)
    requests: Mapped[int] = mapped_column(BigInteger)
    errors: Mapped[int] = mapped_column(BigInteger)
    ooms: Mapped[int] = mapped_column(BigInteger)
    prompt_tokens: Mapped[int] = mapped_column(BigInteger)
    output_tokens: Mapped[int] = mapped_column(BigInteger)
    drafts: Mapped[int] = mapped_column(BigInteger)
    draft_tokens: Mapped[int] = mapped_column(BigInteger)
    accepted_tokens: Mapped[int] = mapped_column(BigInteger)
    # acceptance rate across requests that drafted: n, sum and M2 (squared deviations from the mean;
    # merged with Chan's formula, `aggregates.merge_m2`) -> mean, stddev
    rate_n: Mapped[int] = mapped_column(BigInteger)
    ttft_count: Mapped[int] = mapped_column(BigInteger)
    locals().update(bucket_columns("ttft") | bucket_columns("e2e"))  # ttft_b00.., e2e_b00..
    rate_sum: Mapped[float]
    rate_m2: Mapped[float] = mapped_column(server_default=text("0"))
    ttft_sum: Mapped[float]
    e2e_sum: Mapped[float]
    sketched: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))
    ttft_sketch: Mapped[bytes | None] = mapped_column(LargeBinary)
    e2e_sketch: Mapped[bytes | None] = mapped_column(LargeBinary)
    tpot_sketch: Mapped[bytes | None] = mapped_column(LargeBinary)


class RequestRollup(_RollupColumns, Base):
    """Per-minute rollups (`period_start` is a multiple of 60)."""

    __tablename__ = "request_rollups"


class RequestRollupHourly(_RollupColumns, Base):
    """Per-hour rollups (`period_start` is a multiple of 3600): month-long queries read ~720 periods."""

    __tablename__ = "request_rollups_hourly"


class MaintenanceState(Base):
    """Small persistent key -> number state of background jobs (e.g. the last rolled-up request id)."""

    __tablename__ = "maintenance_state"

    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[float]


class VllmScrape(Base):
    """What one vLLM engine did between two scrapes of its /metrics (counter deltas).

    Histograms keep vLLM's own bucket bounds (`*_bounds`, without +Inf) with
    non-cumulative counts per bucket (`*_counts`, the last one above the largest bound).
    """

    __tablename__ = "vllm_scrapes"
    __table_args__ = (Index("ix_vllm_scrapes_at", "at"),)

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    source: Mapped[str] = mapped_column(String(512))
    model: Mapped[str] = mapped_column(String(256))
    engine: Mapped[str] = mapped_column(String(64))
    at: Mapped[float]
    interval_s: Mapped[float]
    counter_reset: Mapped[bool]
    drafts: Mapped[float]
    draft_tokens: Mapped[float]
    accepted_tokens: Mapped[float]
    accepted_per_position: Mapped[list[float]]
    ttft_bounds: Mapped[list[float]]
    ttft_counts: Mapped[list[float]]
    ttft_sum: Mapped[float]
    e2e_bounds: Mapped[list[float]]
    e2e_counts: Mapped[list[float]]
    e2e_sum: Mapped[float]
    generation_tokens: Mapped[float] = mapped_column(server_default=text("0"))  # vllm:generation_tokens_total delta
    speculating: Mapped[bool | None]  # the spec-decode families are exposed (None: scraped before 0018)


class CaptureRow(Base):
    """One captured request's prompt and output (telemetry.capture; issue 56), kept apart from `requests`
    so that no request read ever touches users' text; deleted at `expires_at` by the retention pass.
    `tenant` is the capture's tenant tag (a tenant-bound ingest token's own); `chars` its stored text."""

    __tablename__ = "captures"
    __table_args__ = (
        Index("ix_captures_expires_at", "expires_at"),
        Index("ix_captures_tenant_started_at", "tenant", "started_at"),
    )

    id: Mapped[int] = mapped_column(BigId, primary_key=True, autoincrement=True)
    capture_id: Mapped[str] = mapped_column(String(128), unique=True)
    tenant: Mapped[str | None] = mapped_column(String(128))
    instance: Mapped[str] = mapped_column(String(128))
    model: Mapped[str] = mapped_column(String(128))
    drafter: Mapped[str | None] = mapped_column(String(256))
    kind: Mapped[str] = mapped_column(String(16))
    tags: Mapped[dict[str, str]]
    started_at: Mapped[float]
    prompt: Mapped[list[dict[str, str]]] = mapped_column(JSON())
    output: Mapped[str] = mapped_column(Text())
    prompt_tokens: Mapped[int] = mapped_column(BigInteger)
    output_tokens: Mapped[int] = mapped_column(BigInteger)
    num_draft_tokens: Mapped[int] = mapped_column(BigInteger)
    num_accepted_tokens: Mapped[int] = mapped_column(BigInteger)
    truncated: Mapped[bool]
    redactions: Mapped[int] = mapped_column(BigInteger)
    chars: Mapped[int] = mapped_column(BigInteger)
    stored_at: Mapped[float]
    expires_at: Mapped[float]


# Tables the migrations create for another package, which defines them: the alerts' state, history,
# rule health, outbox and actions (alerts/tables.py; migration 0004). Schema comparisons against this
# module's metadata leave them to that package's own check (tests/alerts/test_alert_tables.py).
OTHER_PACKAGES_TABLES = frozenset(
    {
        "alert_states",
        "alert_transitions",
        "alert_rule_health",
        "alert_notifications",
        "alert_actions",
        "alert_detector_series",  # the change detectors' state and the per-request flags (migration 0012)
        "alert_detector_cursors",
        "request_flags",
    }
)
