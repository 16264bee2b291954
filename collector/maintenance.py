"""The collector's background jobs, every `maintenance_interval_s`: on PostgreSQL the raw tables' day
partitions ahead (`collector.tiers.partitions`), roll-ups, retention (expired captures too)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial

from specwatch.collector.captures import expire_captures
from specwatch.collector.db import write_transaction
from specwatch.collector.ingest.store import Store
from specwatch.collector.settings import Settings
from specwatch.collector.tiers import partitions
from specwatch.collector.tiers.rollups import Expiry, apply_retention, roll_up

log = logging.getLogger("specwatch.collector")
DAY_S = 86400.0


def run_once(store: Store, settings: Settings, now: float | None = None, expiries: Sequence[Expiry] = ()) -> None:
    now = time.time() if now is None else now
    raw_s, rollup_s = settings.retention_days * DAY_S, settings.rollup_retention_days * DAY_S
    if store.db.dialect.name == "postgresql":
        with write_transaction(store.db) as conn:
            if created := partitions.ensure_ahead(conn, now):
                log.info("created partitions %s", ", ".join(created))
    report = roll_up(store.db, now, lock=store.write_lock())
    deleted_raw, deleted_rollups = apply_retention(
        store.db, now, raw_s, rollup_s, lock=store.write_lock(), expiries=expiries
    )
    with store.write_lock(), write_transaction(store.db) as conn:
        if deleted := expire_captures(conn, now):  # each capture at its own expires_at (collector.captures)
            log.info("deleted %d expired captures", deleted)
    if report.rows_folded or deleted_raw or deleted_rollups:
        log.info(
            "rolled up %d requests; deleted %d raw requests and %d rollup rows",
            report.rows_folded,
            deleted_raw,
            deleted_rollups,
        )


def in_turn(turn: threading.Lock | None, job: Callable[[], object]) -> None:
    """`job`, holding `turn` (when given): the leader's background passes run one at a time.

    They share one process, so one GIL: a CPU-bound alert cycle (the drift and anomaly passes step
    each new request in Python) beside a roll-up made the roll-up wait up to the 5 ms switch interval
    at every SQLite call, and a chunk that takes 0.25 s alone held the write lock 3.6 s, long enough
    for ingest to answer 503 (issue 30: max 4.5 s under 4 producers; 0.5 s with the passes in turn)."""
    with turn or contextlib.nullcontext():
        job()


async def maintenance_loop(
    store: Store, settings: Settings, turn: threading.Lock | None = None, expiries: Sequence[Expiry] = ()
) -> None:
    """Runs until cancelled; a failing pass is logged and retried next interval. `turn`: see `in_turn`;
    `expiries`: see `rollups.apply_retention`."""
    while True:
        try:
            await asyncio.to_thread(in_turn, turn, partial(run_once, store, settings, expiries=expiries))
        except Exception:  # noqa: BLE001 - keep the loop alive; the next pass retries
            log.exception("maintenance pass failed")
        await asyncio.sleep(settings.maintenance_interval_s)
