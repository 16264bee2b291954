"""Upstreams: what `--upstream NAME=URL[,drafter=D][,gamma=K][,capacity=N][,pool=spec|plain][,auth=forward]`
says (`auth=forward`: this upstream also gets the client's `Authorization` header; off by default),
and what the gateway knows about each one now (health, load, requests in flight).

Load is (running + waiting) / capacity, the engine policy's definition: running and waiting
come from the upstream's own /metrics (`vllm:num_requests_running` / `_waiting`, or our engine's
`specwatch_engine_*` gauges) scraped every health interval, and never read lower than the
requests this gateway itself has in flight there (a scrape is up to one interval old).
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from specwatch.common.errors import UsageError
from specwatch.telemetry.schema import DRAFTER_PATTERN

NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}"
OPTIONS = ("drafter", "gamma", "capacity", "pool", "auth")
AUTH = ("none", "forward")  # whether the client's Authorization header goes to this upstream
RUNNING = ("vllm:num_requests_running", "specwatch_engine_num_requests_running")
WAITING = ("vllm:num_requests_waiting", "specwatch_engine_num_requests_waiting")
DEFAULT_CAPACITY = 8  # vllm_server.VllmServer's --max-num-seqs and our engine's default slots


@dataclass(frozen=True)
class Upstream:
    name: str
    url: str
    drafter: str | None = None  # the telemetry label of its speculative method; None: plain decoding
    gamma: int = 0  # its num_speculative_tokens, when known
    capacity: int = DEFAULT_CAPACITY  # concurrent sequences it serves (vLLM's --max-num-seqs)
    pool: str = "plain"  # 'spec' | 'plain'
    forward_auth: bool = False  # `auth=forward`: the client's Authorization header goes to it (docs/security.md)

    @property
    def speculative(self) -> bool:
        return self.drafter is not None


def parse_upstream(text: str) -> Upstream:
    """One `--upstream` value; UsageError saying what is wrong."""
    name, sep, rest = text.partition("=")
    if not sep or not re.fullmatch(NAME_PATTERN, name):
        raise UsageError(
            f"--upstream {text!r}: expected NAME=URL[,drafter=D][,gamma=K][,capacity=N]"
            "[,pool=spec|plain][,auth=forward]"
        )
    url, *options = rest.split(",")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.query or parts.fragment:
        raise UsageError(f"--upstream {name}: {url!r} is not an http(s)://HOST[:PORT] URL")
    values = _options(name, options)
    drafter = values.get("drafter")
    if drafter in (None, "none"):
        drafter = None
    elif not re.fullmatch(DRAFTER_PATTERN, drafter):
        raise UsageError(
            f"--upstream {name}: drafter {drafter!r} is not one of ngram, suffix, eagle, eagle3, mtp, medusa, "
            "draft_model:NAME, model:NAME, early-exit:K, none"
        )
    pool = values.get("pool", "spec" if drafter else "plain")
    if pool not in ("spec", "plain"):
        raise UsageError(f"--upstream {name}: pool must be spec or plain, not {pool!r}")
    if values.get("auth", "none") not in AUTH:
        raise UsageError(f"--upstream {name}: auth must be none or forward, not {values['auth']!r}")
    gamma = _int_option(name, values, "gamma", 0, 0, 64)
    capacity = _int_option(name, values, "capacity", DEFAULT_CAPACITY, 1, 1_000_000)
    return Upstream(name, url.rstrip("/"), drafter, gamma, capacity, pool, values.get("auth") == "forward")


def _options(name: str, options: list[str]) -> dict[str, str]:
    values: dict[str, str] = {}
    for option in options:
        key, sep, value = option.partition("=")
        if not sep or key not in OPTIONS or not value:
            raise UsageError(f"--upstream {name}: bad option {option!r} (options: {', '.join(OPTIONS)}, as KEY=VALUE)")
        if key in values:
            raise UsageError(f"--upstream {name}: {key} given twice")
        values[key] = value
    return values


def _int_option(name: str, values: dict[str, str], key: str, default: int, low: int, high: int) -> int:
    if key not in values:
        return default
    if not values[key].isdecimal() or not low <= int(values[key]) <= high:
        raise UsageError(f"--upstream {name}: {key} must be an integer in {low}..{high}, not {values[key]!r}")
    return int(values[key])


def check_upstreams(upstreams: list[Upstream]) -> None:
    if not upstreams:
        raise UsageError("give at least one --upstream NAME=URL")
    names = [u.name for u in upstreams]
    if len(set(names)) != len(names):
        raise UsageError(
            f"--upstream names must be unique: {', '.join(sorted({n for n in names if names.count(n) > 1}))}"
        )


class ProcessorSharing:
    """Each request in flight at one upstream gets 1/n of every interval during which n are in flight.

    The gateway cannot see an upstream's device, only its own requests there; this splits the
    upstream's time among them as a processor-sharing server would. A running integral
    V(t) = ∫ dt / n(t) (over the time n > 0) makes each start and end O(1): a request's share is
    V(end) - V(start). A request that waits in the upstream's queue is counted as served: an estimate.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self.in_flight = 0
        self._virtual = 0.0  # V at `_at`
        self._at = clock()

    def _advance(self) -> float:
        now = self.clock()
        if self.in_flight:
            self._virtual += (now - self._at) / self.in_flight
        self._at = now
        return self._virtual

    def enter(self) -> float:
        """A request goes upstream; keep the returned mark for `leave`."""
        mark = self._advance()
        self.in_flight += 1
        return mark

    def leave(self, mark: float) -> float:
        """The request's last byte arrived (or it failed): its share of the upstream's time since `enter`."""
        if self.in_flight < 1:
            raise RuntimeError("leave() without a matching enter()")
        share = self._advance() - mark
        self.in_flight -= 1
        return share


@dataclass
class UpstreamState:
    """What the gateway knows about one upstream now; mutated only on the event loop."""

    upstream: Upstream
    healthy: bool = True
    in_flight: int = 0
    running: float = 0.0  # from its /metrics, as of `scraped_at`
    waiting: float = 0.0
    scraped_at: float | None = None
    checked_at: float | None = None
    last_error: str | None = None
    down_since: float | None = None
    failed_checks: int = 0  # health checks failed in a row (gateway.core.Gateway.check)
    served: dict[str, int] = field(default_factory=dict)  # status -> requests
    sharing: ProcessorSharing = field(default_factory=ProcessorSharing)  # each record's device_s

    @property
    def load(self) -> float:
        busy = max(self.running + self.waiting, float(self.in_flight))
        return busy / self.upstream.capacity

    def mark_down(self, reason: str) -> None:
        if self.healthy:
            self.down_since = time.time()
        self.healthy, self.last_error = False, reason

    def mark_up(self) -> None:
        self.healthy, self.down_since = True, None

    def read_metrics(self, text: str) -> None:
        """Running and waiting requests from a Prometheus exposition (summed over label sets)."""
        running = waiting = 0.0
        for line in text.splitlines():
            if line.startswith(RUNNING):
                running += _sample_value(line)
            elif line.startswith(WAITING):
                waiting += _sample_value(line)
        self.running, self.waiting, self.scraped_at = running, waiting, time.time()

    def describe(self) -> dict:
        u = self.upstream
        return {
            "name": u.name,
            "url": u.url,
            "pool": u.pool,
            "drafter": u.drafter,
            "gamma": u.gamma,
            "capacity": u.capacity,
            "healthy": self.healthy,
            "down_since": self.down_since,
            "last_error": self.last_error,
            "in_flight": self.in_flight,
            "running": self.running,
            "waiting": self.waiting,
            "load": round(self.load, 4),
            "checked_at": self.checked_at,
            "scraped_at": self.scraped_at,
            "served": dict(self.served),
        }


def _sample_value(line: str) -> float:
    """The value of one exposition line `name{labels} value [timestamp]`; 0 when unreadable."""
    name_end = line.rfind("}") + 1 if "{" in line else line.find(" ")
    try:
        return float(line[name_end:].split()[0])
    except (IndexError, ValueError):
        return 0.0
