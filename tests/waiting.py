"""Polling with a deadline, for tests that watch another thread or process."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest


def wait_for(condition, what: str | Callable[[], str], timeout: float = 40.0, interval: float = 0.1):
    """Return condition()'s first truthy result; fail the test after `timeout` seconds.

    `what` names the awaited thing; a callable is called on failure, to report the state it stopped in."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if result := condition():
            return result
        time.sleep(interval)
    pytest.fail(f"timed out waiting for {what() if callable(what) else what}")
