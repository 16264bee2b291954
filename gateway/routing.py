"""Which pool serves a request, and why (the record's `mode_reason` and `arm`).

In order of precedence, as the engine's own policy (engine/policy.py) decides for one engine:

1. a manual or alert override from the control API          -> 'manual' / 'alert'
2. prompts longer than `long_prompt_tokens`                  -> 'long_prompt'
3. no healthy upstream in the spec pool                      -> 'failover'
4. the spec pool's load above `load_off`, back below `load_on`
   (hysteresis, at most one switch per cool-down)            -> 'load'
5. a canary split: `canary` of requests go to the spec pool (arm 'spec'), the rest to the
   plain pool (arm 'control'); sticky per session key (a hash of the request's `user` or
   its `x-specwatch-session` header), random without one  -> 'canary'
   The share starts at `canary` and is live: `POST /v1/control/canary` (`specwatch tune canary`)
   sets it, 1.0 promoting the spec pool (the candidate), 0.0 rolling back to the plain pool
   (today's config), None ending the split
6. the spec pool's recent acceptance below `min_acceptance` (every `probe_every`-th
   request still goes there to re-measure)                   -> 'low_acceptance'
   Recent speculative requests that drafted nothing (a k = 0 schedule entry) count too, so the
   acceptance is never the stale figure of drafts long gone: where fewer than
   `min_drafted_fraction` of their decode steps drafted, the state says `speculation_inactive`
   and the acceptance is unknown (None), neither low nor healthy.
7. otherwise the spec pool                                   -> 'default'

A request routed to the plain pool while no plain upstream is healthy goes to the spec pool
('failover'), and the reverse; with no upstream at all, the gateway answers 503.
"""

from __future__ import annotations

import hashlib
import random
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Literal

from specwatch.common.policy import LoadSwitch
from specwatch.telemetry import ratios
from specwatch.telemetry.schema import RequestRecord

Override = Literal["auto", "speculative", "autoregressive"]


@dataclass(frozen=True)
class RoutingConfig:
    canary: float | None = None  # share of traffic for the spec pool under an A/B split; None: no split
    load_off: float = 0.75
    load_on: float = 0.60
    long_prompt_tokens: int = 2048
    min_acceptance: float = 0.3
    min_drafted_fraction: float = 0.05  # below this share of decode steps drafting, speculation is inactive
    acceptance_window: int = 32  # recent speculative requests with draft counts
    min_window: int = 4
    probe_every: int = 8
    cooldown_s: float = 5.0

    def __post_init__(self) -> None:
        if self.canary is not None and not 0.0 <= self.canary <= 1.0:
            raise ValueError("canary must be in [0, 1]")
        if not 0 < self.load_on <= self.load_off:
            raise ValueError("need 0 < load_on <= load_off")
        if min(self.long_prompt_tokens, self.acceptance_window, self.min_window, self.probe_every) < 1:
            raise ValueError("long_prompt_tokens, acceptance_window, min_window and probe_every must be >= 1")
        if not 0.0 <= self.min_acceptance <= 1.0:
            raise ValueError("min_acceptance must be in [0, 1]")
        if not 0.0 <= self.min_drafted_fraction <= 1.0:
            raise ValueError("min_drafted_fraction must be in [0, 1]")


@dataclass(frozen=True)
class Route:
    pool: str  # 'spec' | 'plain'
    reason: str  # the record's mode_reason
    arm: str | None = None


def session_share(key: str) -> float:
    """A stable point in [0, 1) for a session key: the same user always lands in the same arm."""
    return int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "big") / 2.0**64


class Router:
    def __init__(self, config: RoutingConfig, seed: int | None = None) -> None:
        self.config = config
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._override: tuple[Override, str] = ("auto", "manual")
        self._load = LoadSwitch(config.load_off, config.load_on, config.cooldown_s)
        # (draft tokens, accepted tokens, drafts, output tokens) of recent speculative requests
        self._acceptance: deque[tuple[int, int, int, int]] = deque(maxlen=config.acceptance_window)
        self._low_count = 0
        self._canary = config.canary

    def set_canary(self, share: float | None) -> float | None:
        """The live canary share (None: no split); returns the previous one."""
        if share is not None and not 0.0 <= share <= 1.0:
            raise ValueError("canary share must be in [0, 1]")
        with self._lock:
            previous, self._canary = self._canary, share
        return previous

    def set_override(self, mode: Override, reason: str = "manual") -> None:
        with self._lock:
            self._override = (mode, reason)

    def decide(
        self, prompt_tokens: int, session: str | None, spec_up: bool, spec_load: float, now: float | None = None
    ) -> Route:
        now = time.monotonic() if now is None else now
        with self._lock:
            self._load.update(spec_load, now)
            mode, reason = self._override
            if mode != "auto":
                return Route("spec" if mode == "speculative" else "plain", reason)
            if prompt_tokens > self.config.long_prompt_tokens:
                return Route("plain", "long_prompt")
            if not spec_up:
                return Route("plain", "failover")
            if not self._load.allows:
                return Route("plain", "load")
            if self._canary is not None:
                share = session_share(session) if session else self._rng.random()
                return Route("spec", "canary", "spec") if share < self._canary else Route("plain", "canary", "control")
            if self._acceptance_low():
                self._low_count += 1
                if self._low_count % self.config.probe_every:
                    return Route("plain", "low_acceptance")
            return Route("spec", "default")

    def _acceptance_low(self) -> bool:
        if len(self._acceptance) < self.config.min_window or self._inactive():
            return False
        acceptance = self._recent_acceptance()
        return acceptance is not None and acceptance < self.config.min_acceptance

    def _recent_acceptance(self) -> float | None:
        """Accepted / drafted tokens of the recent speculative requests; None while speculation is inactive."""
        drafted, accepted = (sum(entry[i] for entry in self._acceptance) for i in (0, 1))
        return None if self._inactive() else ratios.acceptance_rate(accepted, drafted)

    def _inactive(self) -> bool:
        """At least `min_window` recent speculative requests, fewer than `min_drafted_fraction` of whose
        decode steps drafted."""
        if len(self._acceptance) < self.config.min_window:
            return False
        _, accepted, drafts, output = (sum(entry[i] for entry in self._acceptance) for i in range(4))
        fraction = ratios.drafted_step_fraction(drafts, accepted, output)
        return fraction is not None and fraction < self.config.min_drafted_fraction

    def observe(self, record: RequestRecord) -> None:
        """Feed back a finished request: speculative ones whose draft counts are known (drafting or not)
        update the acceptance window."""
        if record.mode == "speculative" and record.status == "ok" and record.draft_counts_known:
            entry = (record.num_draft_tokens, record.num_accepted_tokens, record.num_drafts, record.output_tokens)
            with self._lock:
                self._acceptance.append(entry)

    @property
    def state(self) -> dict:
        with self._lock:
            return {
                "override": self._override[0],
                "override_reason": self._override[1],
                "canary": self._canary,
                "load_allows_speculation": self._load.allows,
                "recent_acceptance": self._recent_acceptance(),
                "recent_speculative_requests": len(self._acceptance),
                "speculation_inactive": self._inactive(),
                "config": {k: getattr(self.config, k) for k in self.config.__dataclass_fields__},
            }
