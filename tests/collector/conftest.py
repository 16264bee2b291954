"""Fixtures for the collector tests: a migrated database per test, SQLite and PostgreSQL.

PostgreSQL runs when SPECWATCH_TEST_POSTGRES_URL points at a server (.ci/run starts one);
otherwise its parametrisations are skipped with that reason.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine, text

from collector.app import create_app
from collector.db import make_engine, upgrade
from collector.settings import Settings
from collector_payloads import event_dict, request_dict, sample_dict

POSTGRES_URL = os.environ.get("SPECWATCH_TEST_POSTGRES_URL")


def _reset_postgres(url: str) -> None:
    engine = make_engine(url)
    with engine.begin() as conn:
        conn.execute(text("DROP SCHEMA public CASCADE"))
        conn.execute(text("CREATE SCHEMA public"))
    engine.dispose()


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request: pytest.FixtureRequest, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'specwatch.db'}"
    if not POSTGRES_URL:
        pytest.skip("SPECWATCH_TEST_POSTGRES_URL is not set (.ci/run starts a PostgreSQL and sets it)")
    _reset_postgres(POSTGRES_URL)
    return POSTGRES_URL


@pytest.fixture
def engine(db_url: str) -> Engine:
    engine = make_engine(db_url)
    upgrade(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def settings(db_url: str, tmp_path) -> Settings:
    # The fixed test epoch is months old: keep retention from deleting it under the tests.
    return Settings(data_dir=tmp_path, database_url=db_url, max_body_bytes=256 * 1024, retention_days=36500)


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def client(settings: Settings, registry: CollectorRegistry) -> TestClient:
    with TestClient(create_app(settings, registry)) as test_client:
        yield test_client


@pytest.fixture
def make_request() -> Callable[..., dict[str, Any]]:
    return request_dict


@pytest.fixture
def make_sample() -> Callable[..., dict[str, Any]]:
    return sample_dict


@pytest.fixture
def make_event() -> Callable[..., dict[str, Any]]:
    return event_dict
