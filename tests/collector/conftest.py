"""Fixtures for the collector tests (the database ones, `db_url` and `engine`, are in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client import CollectorRegistry

from collector.app import create_app
from collector.settings import Settings
from collector_payloads import event_dict, request_dict, sample_dict


@pytest.fixture
def settings(db_url: str, tmp_path) -> Settings:
    # The fixed test epoch is months old: keep retention from deleting it under the tests.
    # Ingest runs in threads here (spawning worker processes per test costs ~1 s);
    # test_ingest_workers.py runs it in worker processes, as the service does by default.
    return Settings(data_dir=tmp_path, database_url=db_url, max_body_bytes=256 * 1024, retention_days=36500,
                    ingest_processes=0)


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
