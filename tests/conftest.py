"""Fixtures shared by all tests: a migrated database per test, SQLite and PostgreSQL.

PostgreSQL runs when SPECWATCH_TEST_POSTGRES_URL points at a server (.ci/run starts one);
otherwise its parametrisations are skipped with that reason.
"""

from __future__ import annotations

import os

import pytest
from sqlalchemy import Engine, text

from collector.db import make_engine, upgrade

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


@pytest.fixture(scope="session")
def bundled_engine():
    """The bundled SmolLM2-135M-Instruct in float32 (exactness is a float32 property)."""
    from engine.engine import Engine, EngineConfig

    return Engine(EngineConfig(dtype="float32", instance="test"))
