"""PostgreSQL day partitions of the raw tables: migration 0010 on a database with data, ingest,
retention by dropped partitions, the default partition."""

from __future__ import annotations

import pytest
from alembic import command
from collector_payloads import T0, event_dict, request_dict, sample_dict
from sqlalchemy import Engine, inspect, text

from specwatch.collector.db import alembic_config, make_db, upgrade
from specwatch.collector.ingest.store import Store
from specwatch.collector.models import DeviceSampleRow, EngineEventRow, Request, VllmScrape
from specwatch.collector.tiers import partitions
from specwatch.collector.tiers.rollups import apply_retention, roll_up
from specwatch.telemetry.schema import IngestBatch

DAY = 86400
DAY0 = partitions.day_start(T0)  # the midnight before T0
DAYS = 5
PER_DAY = 40
RAW_TABLES = ("requests", "device_samples", "engine_events", "vllm_scrapes")


@pytest.fixture
def pg(postgres_url) -> Engine:
    db = make_db(postgres_url)
    with db.begin() as conn:
        conn.execute(text("DROP SCHEMA public CASCADE"))
        conn.execute(text("CREATE SCHEMA public"))
    yield db
    db.dispose()


def requests_over_days(days: int = DAYS, per_day: int = PER_DAY) -> list[dict]:
    """`per_day` requests in each of `days` UTC days from DAY0, spread over the day."""
    return [
        request_dict(day * per_day + i, started_at=DAY0 + day * DAY + 100 + i * (DAY - 200) / per_day)
        for day in range(days)
        for i in range(per_day)
    ]


def scrape_row(i: int) -> dict:
    return {
        "source": "http://vllm:8000/metrics",
        "model": "m",
        "engine": "0",
        "at": DAY0 + i * DAY / 4 + 7,
        "interval_s": 15.0,
        "counter_reset": False,
        "drafts": 10.0 + i,
        "draft_tokens": 40.0,
        "accepted_tokens": 20.0,
        "accepted_per_position": [8.0, 6.0, 4.0, 2.0],
        "ttft_bounds": [0.1, 1.0],
        "ttft_counts": [3.0, 1.0, 0.0],
        "ttft_sum": 0.5,
        "e2e_bounds": [1.0],
        "e2e_counts": [2.0, 2.0],
        "e2e_sum": 4.5,
    }


def fill_at_0009(db: Engine) -> None:
    """Rows in every raw table over DAYS days, written as 0009's tables take them (plain inserts)."""
    batch = IngestBatch.model_validate(
        {
            "requests": requests_over_days(),
            "samples": [sample_dict(i, at=DAY0 + i * DAY / 8) for i in range(DAYS * 8)],
            "events": [event_dict(i, at=DAY0 + i * DAY / 3) for i in range(DAYS * 3)],
        }
    )
    with db.begin() as conn:
        for model, records in (
            (Request, batch.requests),
            (DeviceSampleRow, batch.samples),
            (EngineEventRow, batch.events),
        ):
            later = {"drafts_per_position", "failed_device_s"} if model is Request else set()  # added after 0009
            conn.execute(model.__table__.insert(), [record.model_dump(exclude=later) for record in records])
        conn.execute(VllmScrape.__table__.insert(), [scrape_row(i) for i in range(DAYS * 4)])


def checksums(db: Engine) -> dict[str, tuple[int, str]]:
    """Per raw table: row count and an md5 over every column of every row, in id order."""
    with db.connect() as conn:
        return {
            table: tuple(
                conn.execute(text(f"SELECT count(*), md5(string_agg(t::text, '|' ORDER BY id)) FROM {table} t")).one()
            )
            for table in RAW_TABLES
        }


def partition_days(db: Engine, table: str) -> list[int]:
    with db.connect() as conn:
        return [int(part.start) for part in partitions.day_partitions(conn, table)]


def rows_in(db: Engine, relation: str) -> int:
    with db.connect() as conn:
        return conn.scalar(text(f"SELECT count(*) FROM ONLY {relation}"))


def test_upgrade_from_0009_with_data_loses_nothing_and_partitions_by_day(pg):
    upgrade(pg, "0009")
    fill_at_0009(pg)
    before = checksums(pg)
    assert before["requests"][0] == DAYS * PER_DAY
    upgrade(pg, "0013")  # the last revision that adds no request column: every row reads as it did
    assert checksums(pg) == before
    upgrade(pg)
    with pg.connect() as conn:  # 0014's column: empty for every old row
        assert conn.scalar(text("SELECT count(*) FROM requests WHERE drafts_per_position::text <> '[]'")) == 0
    with pg.connect() as conn:
        assert all(partitions.is_partitioned(conn, table) for table in RAW_TABLES)
        assert conn.scalar(text("SELECT count(*) FROM pg_inherits WHERE inhparent = 'requests'::regclass")) >= DAYS + 1
    data_days = [DAY0 + d * DAY for d in range(DAYS)]
    for table in RAW_TABLES:
        assert partition_days(pg, table)[:DAYS] == data_days  # then today and the days ahead
        assert rows_in(pg, partitions.default_name(table)) == 0
    assert rows_in(pg, partitions.partition_name("requests", DAY0 + DAY)) == PER_DAY
    unique = {uq["name"]: uq["column_names"] for uq in inspect(pg).get_unique_constraints("requests")}
    assert unique == {"uq_requests_request_id_started_at": ["request_id", "started_at"]}
    assert inspect(pg).get_pk_constraint("requests")["constrained_columns"] == ["id", "started_at"]


def test_ingest_after_upgrade_is_idempotent_and_ids_continue(pg):
    upgrade(pg, "0009")
    fill_at_0009(pg)
    upgrade(pg)
    store = Store(pg)
    batch = IngestBatch.model_validate(
        {"requests": [request_dict(10_000 + i, started_at=DAY0 + 3600 + i) for i in range(50)]}
    )
    assert store.insert(batch).requests == 50
    resent = store.insert(batch)
    assert (resent.requests, resent.request_duplicates, resent.conflicts) == (0, 50, 0)
    old = store.insert(IngestBatch.model_validate({"requests": requests_over_days(1)}))  # stored before the upgrade
    assert (old.requests, old.request_duplicates) == (0, PER_DAY)
    assert rows_in(pg, "requests") == 0 and checksums(pg)["requests"][0] == DAYS * PER_DAY + 50
    assert roll_up(pg, now=DAY0 + DAYS * DAY).rows_folded == DAYS * PER_DAY + 50  # new ids follow the old ones


def test_same_request_id_with_another_started_at_is_a_second_row_on_postgresql(pg):
    upgrade(pg)
    store = Store(pg)
    store.insert(IngestBatch.model_validate({"requests": [request_dict(1)]}))
    changed = store.insert(IngestBatch.model_validate({"requests": [request_dict(1, ttft_s=0.9)]}))
    assert (changed.request_duplicates, changed.conflict_ids) == (1, ("req-1",))  # same key: a conflict
    moved = store.insert(IngestBatch.model_validate({"requests": [request_dict(1, started_at=T0 + 5)]}))
    assert moved.requests == 1  # documented in collector.tiers.partitions


def test_retention_drops_whole_old_days_and_deletes_only_the_boundary_day(pg):
    upgrade(pg, "0009")
    fill_at_0009(pg)
    upgrade(pg)
    now = DAY0 + (DAYS + 2) * DAY + DAY / 2
    roll_up(pg, now=now)
    cutoff = DAY0 + 2 * DAY + DAY / 2  # retention keeps the second half of day 2 and later
    raw, _ = apply_retention(pg, now=now, raw_retention_s=now - cutoff, rollup_retention_s=now - DAY0 - DAY)
    assert raw == 2 * PER_DAY + PER_DAY // 2
    assert partition_days(pg, "requests")[:3] == [DAY0 + 2 * DAY, DAY0 + 3 * DAY, DAY0 + 4 * DAY]
    assert partition_days(pg, "vllm_scrapes")[0] == DAY0 + DAY  # its own (rollup) retention
    assert rows_in(pg, partitions.partition_name("requests", DAY0 + 2 * DAY)) == PER_DAY // 2
    with pg.connect() as conn:
        assert conn.scalar(text("SELECT min(started_at) FROM requests")) >= cutoff
        assert conn.scalar(text("SELECT min(at) FROM device_samples")) >= cutoff
        assert conn.scalar(text("SELECT count(*) FROM requests")) == (DAYS - 2) * PER_DAY - PER_DAY // 2


def test_a_day_not_rolled_up_is_not_dropped(pg):
    upgrade(pg)
    with pg.begin() as conn:
        partitions.create_day(conn, partitions.BY_NAME["requests"], DAY0)
    Store(pg).insert(IngestBatch.model_validate({"requests": requests_over_days(1)}))
    now = DAY0 + 30 * DAY
    assert apply_retention(pg, now=now, raw_retention_s=14 * DAY, rollup_retention_s=400 * DAY) == (0, 0)
    assert partition_days(pg, "requests")[0] == DAY0
    roll_up(pg, now=now)
    assert apply_retention(pg, now=now, raw_retention_s=14 * DAY, rollup_retention_s=400 * DAY)[0] == PER_DAY
    assert DAY0 not in partition_days(pg, "requests")


def test_far_future_record_goes_to_the_default_partition_and_moves_into_its_day(pg):
    upgrade(pg)
    future = T0 + 3650 * DAY
    store = Store(pg)
    assert store.insert(IngestBatch.model_validate({"requests": [request_dict(1, started_at=future)]})).requests == 1
    assert rows_in(pg, "requests_default") == 1
    assert store.insert(IngestBatch.model_validate({"requests": [request_dict(1, started_at=future)]})).requests == 0
    with pg.begin() as conn:
        created = partitions.ensure_ahead(conn, future - DAY)  # the leader, when that day comes near
    assert partitions.partition_name("requests", partitions.day_start(future)) in created
    assert rows_in(pg, "requests_default") == 0
    assert rows_in(pg, partitions.partition_name("requests", partitions.day_start(future))) == 1
    with pg.connect() as conn:
        assert conn.scalar(text("SELECT request_id FROM requests WHERE started_at = :at"), {"at": future}) == "req-1"


def test_downgrade_restores_plain_tables_with_every_row(pg):
    upgrade(pg, "0009")
    fill_at_0009(pg)
    before = checksums(pg)
    upgrade(pg)
    config = alembic_config()
    with pg.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "0009")
    assert checksums(pg) == before
    with pg.connect() as conn:
        assert not any(partitions.is_partitioned(conn, table) for table in RAW_TABLES)
