"""Fixtures for the collector tests: a migrated database per test, SQLite and PostgreSQL.

PostgreSQL runs when SPECWATCH_TEST_POSTGRES_URL points at a server (.ci/run starts one);
otherwise its parametrisations are skipped with that reason.
"""

from __future__ import annotations

import os
from typing import Any, Callable

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry
from sqlalchemy import Engine, text

from collector.app import create_app
from collector.db import make_engine, upgrade
from collector.settings import Settings

POSTGRES_URL = os.environ.get("SPECWATCH_TEST_POSTGRES_URL")
T0 = 1_780_000_000.0  # 2026-05-28, a fixed epoch for reproducible windows


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
    return Settings(data_dir=tmp_path, database_url=db_url, max_body_bytes=256 * 1024)


@pytest.fixture
def registry() -> CollectorRegistry:
    return CollectorRegistry()


@pytest.fixture
def client(settings: Settings, registry: CollectorRegistry) -> TestClient:
    with TestClient(create_app(settings, registry)) as test_client:
        yield test_client


def request_dict(i: int, **overrides: Any) -> dict[str, Any]:
    """A valid RequestRecord payload; `i` varies the id, time and counts."""
    accepted = [4, 3, 2, i % 2]
    record = {
        "request_id": f"req-{i}", "instance": "gpu-0", "model": "smollm2-135m", "drafter": "ngram",
        "mode": "speculative", "started_at": T0 + i, "ttft_s": 0.05 + (i % 10) / 100, "e2e_s": 1.0 + (i % 7) / 10,
        "prompt_tokens": 100 + i % 50, "output_tokens": 64, "num_drafts": 4, "num_draft_tokens": 16,
        "num_accepted_tokens": sum(accepted), "accepted_per_position": accepted, "gamma": 4,
        "tags": {"tenant": "acme" if i % 2 else "globex"},
    }
    return {**record, **overrides}


def sample_dict(i: int, **overrides: Any) -> dict[str, Any]:
    sample = {
        "instance": "gpu-0", "at": T0 + 5 * i, "device": "cpu", "mem_allocated_bytes": 1_000 + i,
        "mem_reserved_bytes": 1_500 + i, "fragmentation": 1.5, "power_w": 40.0 + i, "power_source": "rapl",
        "util_target": 0.5, "util_draft": 0.1, "active_requests": 2, "queue_depth": i % 3, "load": 0.4,
    }
    return {**sample, **overrides}


def event_dict(i: int, **overrides: Any) -> dict[str, Any]:
    return {"instance": "gpu-0", "at": T0 + i, "kind": "mode_switch", "detail": {"to": "autoregressive"}, **overrides}


@pytest.fixture
def make_request() -> Callable[..., dict[str, Any]]:
    return request_dict


@pytest.fixture
def make_sample() -> Callable[..., dict[str, Any]]:
    return sample_dict


@pytest.fixture
def make_event() -> Callable[..., dict[str, Any]]:
    return event_dict
