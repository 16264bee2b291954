"""SQL tables of the collector (SQLAlchemy 2 typed ORM).

Column names follow the telemetry contract in `collector.schema`; ORM rows never leave
the collector (queries return plain dataclasses). The Alembic migrations under
`collector/migrations` create exactly these tables; `tests/collector/test_store.py`
checks that the two agree.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, BigInteger, Double, Index, Integer, MetaData, String, UniqueConstraint
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

# SQLite only aliases rowid for INTEGER PRIMARY KEY, so BIGINT becomes INTEGER there.
BigId = BigInteger().with_variant(Integer(), "sqlite")


NAMING = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "pk": "pk_%(table_name)s",
}


class Base(DeclarativeBase):
    metadata = MetaData(naming_convention=NAMING)
    type_annotation_map = {float: Double(), dict[str, Any]: JSON(), list[int]: JSON(), dict[str, str]: JSON()}


class Request(Base):
    """One finished request; `request_id` is the idempotency key."""

    __tablename__ = "requests"
    __table_args__ = (
        Index("ix_requests_started_at", "started_at"),
        Index("ix_requests_instance_started_at", "instance", "started_at"),
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
    draft_s: Mapped[float]
    verify_s: Mapped[float]
    retries: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16))
    error: Mapped[str | None] = mapped_column(String(256))
    energy_j: Mapped[float | None]
    energy_source: Mapped[str | None] = mapped_column(String(16))
    load_at_admission: Mapped[float | None]
    tags: Mapped[dict[str, str]]


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
