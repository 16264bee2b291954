"""Fixtures for the collector tests (the database ones, `db_url` and `engine`, and the service's `settings`,
`registry` and `client` are in tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from collector_payloads import event_dict, request_dict, sample_dict


@pytest.fixture
def make_request() -> Callable[..., dict[str, Any]]:
    return request_dict


@pytest.fixture
def make_sample() -> Callable[..., dict[str, Any]]:
    return sample_dict


@pytest.fixture
def make_event() -> Callable[..., dict[str, Any]]:
    return event_dict
