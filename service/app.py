"""The collector service: `create_app(settings)` builds the FastAPI app.

The lifespan loads the alert rules once, opens the database, upgrades its schema to the newest
migration and runs the background jobs (roll-ups and retention, vLLM scrapes, alerts, the
monthly report) while this process is the leader (`collector.leader`: always on SQLite; one of
the replicas on PostgreSQL); route modules reach those through `deps.py`.
"""

from __future__ import annotations

import asyncio
import threading
from contextlib import asynccontextmanager
from functools import partial

from fastapi import FastAPI
from prometheus_client import CollectorRegistry

from specwatch.alerts.store import expire_history
from specwatch.collector.db import make_db, upgrade
from specwatch.collector.ingest.parse import IngestWorkers
from specwatch.collector.ingest.store import Store
from specwatch.collector.ingest.vllm import Scraper
from specwatch.collector.leader import LeaderMetrics, Leadership
from specwatch.collector.maintenance import maintenance_loop
from specwatch.collector.metrics import CapacityGauge, CollectorMetrics
from specwatch.collector.settings import Settings
from specwatch.collector.speculation_gauges import SpeculationGauges
from specwatch.service import (
    routes_alerts,
    routes_captures,
    routes_cost,
    routes_docs,
    routes_ingest,
    routes_otlp,
    routes_query,
    routes_report,
    routes_requests,
    routes_speculation,
    routes_tune,
)
from specwatch.service.cost_gauges import CostGauge, DailyCosts


def create_app(settings: Settings | None = None, registry: CollectorRegistry | None = None) -> FastAPI:
    settings = settings or Settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        app.state.alert_config = _alert_config(settings)
        db = make_db(settings.database_url_resolved)
        upgrade(db)
        app.state.settings = settings
        app.state.tokens = settings.tokens
        app.state.store = Store(db)
        app.state.metrics = CollectorMetrics(registry or CollectorRegistry())
        app.state.leadership = Leadership(db, settings.replica_name, settings.leader_retry_s)
        leader_only = CollectorRegistry()  # store-derived gauges: the same on every replica
        CostGauge(db, routes_cost.shipped_prices(), registry=leader_only)
        CapacityGauge(db, registry=leader_only)
        SpeculationGauges(
            db,
            registry=leader_only,
            window_s=settings.speculation_window_s,
            min_fraction=settings.speculation_min_fraction,
        )
        _detector_gauges(db, app.state.alert_config, leader_only)
        app.state.daily_costs = DailyCosts(db, routes_cost.shipped_prices())
        LeaderMetrics(app.state.leadership, app.state.metrics.registry, leader_only)
        app.state.ingest = IngestWorkers(
            app.state.store, settings.database_url_resolved, _ingest_processes(settings, db)
        )
        await app.state.ingest.start()
        work = partial(_background_work, app.state.store, settings, app.state.alert_config)
        leading = asyncio.create_task(app.state.leadership.lead(work), name="leadership")
        try:
            yield
        finally:
            leading.cancel()
            await asyncio.gather(leading, return_exceptions=True)
            app.state.ingest.close()
            db.dispose()

    # The documentation routes come from routes_docs, behind the read token like the API.
    app = FastAPI(title="specwatch collector", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.include_router(routes_ingest.router)
    app.include_router(routes_otlp.router)
    app.include_router(routes_query.router)
    app.include_router(routes_speculation.router)
    app.include_router(routes_requests.router)
    app.include_router(routes_alerts.router)
    app.include_router(routes_alerts.rules_router)
    app.include_router(routes_cost.router)
    app.include_router(routes_report.router)
    app.include_router(routes_report.on_demand)
    app.include_router(routes_tune.router)
    app.include_router(routes_captures.router)
    app.include_router(routes_docs.router)
    return app


async def _background_work(store: Store, settings: Settings, alert_config) -> None:
    """The leader's jobs (roll-ups and retention, vLLM scrapes, alerts, the monthly report), until cancelled."""
    db = store.db
    turn = threading.Lock()  # roll-ups and alert cycles one at a time (collector.maintenance.in_turn)
    maintenance = maintenance_loop(store, settings, turn, expiries=(expire_history,))  # the alerts' tables too
    tasks = [asyncio.create_task(maintenance, name="maintenance")]
    tasks += [
        asyncio.create_task(Scraper(url, db, settings.scrape_interval_s).run(), name=f"scrape {url}")
        for url in settings.scrape_vllm
    ]
    runner = _alert_runner(settings, db, alert_config)
    if runner is not None:
        tasks.append(asyncio.create_task(runner.run(turn), name="alerts"))
    if settings.report_dir is not None:
        from specwatch.report.schedule import report_loop

        tasks.append(asyncio.create_task(report_loop(db, settings), name="monthly report"))
    try:
        await asyncio.gather(*tasks)
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if runner is not None:
            runner.close()


def _ingest_processes(settings: Settings, db) -> int:
    """An in-memory SQLite database exists only in this process: ingest there, in threads."""
    in_memory = db.dialect.name == "sqlite" and db.url.database in (None, "", ":memory:")
    return 0 if in_memory else settings.ingest_processes


def _alert_config(settings: Settings):
    """The rules this process evaluates, loaded once (None: alerting is off here).
    The runner and `GET /v1/rules` share it. Rules were validated by `launch`/the CLI before start."""
    if not settings.alerts_enabled:
        return None
    from specwatch.alerts.rules import load_config

    return load_config(settings.alert_rules)


def _detector_gauges(db, config, registry: CollectorRegistry) -> None:
    """specwatch_acceptance_drift_score and _regression_drop, where this process runs the detectors."""
    if config is not None:
        from specwatch.alerts.detector_gauges import DetectorGauges

        DetectorGauges(db, registry=registry)


def _alert_runner(settings: Settings, db, config):
    if config is None:
        return None
    from specwatch.alerts.runner import AlertRunner

    return AlertRunner(db, config, external_url=settings.external_url)
