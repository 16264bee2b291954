"""The collector's query API over HTTP: its URL, the dashboard's tokens, the errors a banner shows.

No Streamlit here. An unreachable or failing collector raises `CollectorUnavailable` with a
message a banner can show; one that refuses the dashboard's token raises `CollectorRefused`.
Requests carry the read token of `SPECWATCH_READ_TOKEN` (the report download the admin token of
`SPECWATCH_ADMIN_TOKEN`), never shown.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import httpx
import pandas as pd

from specwatch.common.auth import ROLE_ENV

DEFAULT_URL = "http://127.0.0.1:8087"


class CollectorUnavailable(RuntimeError):
    pass


class CollectorRefused(CollectorUnavailable):
    """401/403: the collector wants a (different) token; a configuration problem, not an outage."""


@dataclass(frozen=True)
class View:
    """What the sidebar selected: the last `seconds` and the request filters (None: all)."""

    seconds: float = 900.0
    instance: str | None = None
    model: str | None = None
    drafter: str | None = None
    mode: str | None = None
    arm: str | None = None
    tag: str | None = None  # "key:value"

    def params(self, with_filters: bool = True) -> dict:
        params: dict = {"last": self.seconds}
        if with_filters:
            params |= {k: v for k in ("instance", "model", "drafter", "mode", "arm", "tag") if (v := getattr(self, k))}
        return params

    def step_s(self) -> float:
        """About 60 points per chart, in whole minutes."""
        return max(60.0, round(self.seconds / 60 / 60) * 60)


def times(frame: pd.DataFrame, column: str, name: str = "time") -> pd.DataFrame:
    """`frame` with `name`: the API's epoch seconds in `column` as UTC datetimes (an empty frame as it is)."""
    if not frame.empty:
        frame[name] = pd.to_datetime(frame[column], unit="s", utc=True)
    return frame


def collector_url() -> str:
    return os.environ.get("SPECWATCH_COLLECTOR_URL", DEFAULT_URL).rstrip("/")


def auth_headers(role: str = "read") -> dict[str, str]:
    """The Authorization header for `role`'s token (admin: else the read token), none when unset."""
    names = [ROLE_ENV[role]] + ([ROLE_ENV["read"]] if role == "admin" else [])
    token = next((os.environ[name].split(",")[0].strip() for name in names if os.environ.get(name)), "")
    return {"authorization": f"Bearer {token}"} if token else {}


def get(path: str, params: dict | None = None) -> object:
    """The JSON answer of GET `path` with the read token."""
    return _get(path, params, "read", 15.0).json()


def get_bytes(path: str, params: dict | None = None, role: str = "read", timeout_s: float = 15.0) -> bytes:
    """The raw body of GET `path` with `role`'s token (the report: admin, and it takes a while)."""
    return _get(path, params, role, timeout_s).content


def _get(path: str, params: dict | None, role: str, timeout_s: float) -> httpx.Response:
    base = collector_url()
    try:
        response = httpx.get(f"{base}{path}", params=params, headers=auth_headers(role), timeout=timeout_s)
    except httpx.HTTPError as exc:
        raise CollectorUnavailable(f"cannot reach the collector at {base}: {exc}") from None
    return _checked(response, path, role)


def _checked(response: httpx.Response, what: str, role: str) -> httpx.Response:
    """The response if 200; else CollectorRefused (401/403, the collector's message: never the token)
    or CollectorUnavailable."""
    if response.status_code in (401, 403):
        try:
            reason = response.json()["detail"]["message"]
        except (ValueError, KeyError, TypeError):
            reason = response.text[:300]
        raise CollectorRefused(
            f"the collector answered {response.status_code} for {what}: {reason}. "
            f"Set {ROLE_ENV[role]} to one of its {role} tokens and restart the dashboard."
        )
    if response.status_code != 200:
        raise CollectorUnavailable(f"the collector answered {response.status_code} for {what}: {response.text[:300]}")
    return response
