"""The SQL store: migrations match the ORM, batches are atomic and idempotent."""

from __future__ import annotations

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import func, inspect, select, text
from sqlalchemy.orm import Session

from specwatch.collector.db import is_current
from specwatch.collector.ingest.store import Store, StoreUnavailable
from specwatch.collector.models import Base, DeviceSampleRow, EngineEventRow, Request
from specwatch.collector.tiers import partitions
from specwatch.telemetry.schema import IngestBatch


def batch(requests=(), samples=(), events=()) -> IngestBatch:
    return IngestBatch.model_validate({"requests": list(requests), "samples": list(samples), "events": list(events)})


def count(db, model) -> int:
    with db.connect() as conn:
        return conn.scalar(select(func.count()).select_from(model))


def test_migrations_create_exactly_the_orm_tables(db):
    with db.connect() as conn:
        options = partitions.autogenerate_options(conn.dialect.name)  # PostgreSQL: day partitions
        diff = compare_metadata(MigrationContext.configure(conn, opts=options), Base.metadata)
    assert diff == []
    assert is_current(db)
    indexes = {ix["name"] for ix in inspect(db).get_indexes("requests")}
    assert {"ix_requests_started_at", "ix_requests_instance_started_at"} <= indexes


def test_insert_stores_every_column_round_trip(db, make_request, make_sample, make_event):
    record = make_request(1, energy_j=12.5, energy_source="nvml", arm="spec", error=None, tags={"tenant": "x"})
    record |= {"mean_lookahead": 2.5, "device_s": 0.375, "device_s_source": "engine"}
    counts = Store(db).insert(batch([record], [make_sample(1)], [make_event(1, detail={"k": [1, 2.5]})]))
    assert (counts.requests, counts.samples, counts.events, counts.duplicates) == (1, 1, 1, 0)
    with Session(db) as session:
        row = session.scalars(select(Request)).one()
        stored = {c: getattr(row, c) for c in record}
        event = session.scalars(select(EngineEventRow.detail)).one()
    assert stored == record
    assert event == {"k": [1, 2.5]}


def test_duplicates_within_batch_and_already_stored_are_skipped(db, make_request, make_sample, make_event):
    store = Store(db)
    first = store.insert(
        batch([make_request(1), make_request(2), make_request(1)], [make_sample(1)] * 2, [make_event(1)])
    )
    assert (first.requests, first.request_duplicates) == (2, 1)
    assert (first.samples, first.sample_duplicates, first.events) == (1, 1, 1)
    assert [r.request_id for r in first.new_requests] == ["req-1", "req-2"]
    again = store.insert(batch([make_request(2), make_request(3)], [make_sample(1), make_sample(2)], [make_event(1)]))
    assert (again.requests, again.request_duplicates, again.samples, again.sample_duplicates) == (1, 1, 1, 1)
    assert (again.events, again.event_duplicates) == (0, 1)
    assert [r.request_id for r in again.new_requests] == ["req-3"]
    assert [s.at for s in again.new_samples] == [make_sample(2)["at"]]
    assert count(db, Request) == 3 and count(db, DeviceSampleRow) == 2 and count(db, EngineEventRow) == 1


def test_batch_is_one_transaction(db, make_request):
    """A failure half-way through a batch leaves nothing behind."""
    store = Store(db)
    good = batch([make_request(1)])
    with db.begin() as conn:  # a trigger-free way to make the second table fail: drop it
        conn.execute(text("ALTER TABLE device_samples RENAME TO device_samples_gone"))
    with pytest.raises(StoreUnavailable):  # the missing table
        store.insert(
            IngestBatch.model_validate(
                {
                    "requests": [make_request(2)],
                    "samples": [
                        {
                            "instance": "a",
                            "at": 1.8e9,
                            "device": "cpu",
                            "mem_allocated_bytes": 1,
                            "mem_reserved_bytes": 1,
                        }
                    ],
                }
            )
        )
    with db.begin() as conn:
        conn.execute(text("ALTER TABLE device_samples_gone RENAME TO device_samples"))
    assert count(db, Request) == 0
    assert store.insert(good).requests == 1


def test_large_batch_round_trips(db, make_request):
    counts = Store(db).insert(batch([make_request(i) for i in range(5000)]))
    assert counts.requests == 5000
    with db.connect() as conn:
        total = conn.scalar(select(func.sum(Request.num_accepted_tokens)))
    assert total == sum(make_request(i)["num_accepted_tokens"] for i in range(5000))
