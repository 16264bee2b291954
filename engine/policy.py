"""When to speculate: one config, one decision per request, each recorded as `mode_reason`.

Speculation pays at low load on input-grounded text and costs at high load or low
acceptance. The policy, in order of precedence:

1. a manual or alert override from the control API            -> 'manual' / 'alert'
   (draft models unloaded under memory pressure                  -> 'memory')
2. prompts longer than `long_prompt_tokens`                    -> 'long_prompt'
3. load = (busy slots + queue) / slots above `load_off`, back on
   below `load_on` (hysteresis), at most one switch per cooldown -> 'load'
   ... unless speculation is *measured* to pay under that load: while load is high,
   a drafter whose recent goodput (tokens per busy second of the model) beats plain
   decoding's keeps speculating (and so does one not measured yet); every
   `probe_every`-th request (4x rarer once the gap is 1.5x or more) decodes
   plainly so both figures stay fresh. (Load costs speculation only where requests share a
   batch; this keeps `auto` from switching off a drafter that still wins.)
4. a canary split: `canary_fraction` of requests speculate (arm 'spec'),
   the rest decode plainly (arm 'control') for the A/B comparison -> 'canary'
5. a drafter whose recent acceptance rate fell below `min_acceptance`
   (every `probe_every`-th request still speculates to re-measure) -> 'low_acceptance'

A request that asks for drafter 'auto' gets its drafter and lookahead from a `Selector`
first: per scenario tag, an epsilon-greedy bandit over `candidates` (e.g. none,
ngram@4, ngram@8, ngram@16) rewarded by each request's goodput, so grounded traffic
settles on long n-gram drafts and open chat on plain decoding -> 'selected'.
"""

from __future__ import annotations

import random
import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Literal

from specwatch.common.policy import LoadSwitch
from specwatch.engine.suffix import MODEL_FREE
from specwatch.telemetry.schema import RequestRecord
from specwatch.telemetry.sink import TelemetrySink

Override = Literal["auto", "speculative", "autoregressive"]


@dataclass(frozen=True)
class PolicyConfig:
    load_off: float = 0.75
    load_on: float = 0.60
    long_prompt_tokens: int = 512
    canary_fraction: float = 1.0
    min_acceptance: float = 0.3
    acceptance_window: int = 32  # recent speculative requests per drafter
    min_window: int = 4  # no acceptance verdict from fewer requests
    probe_every: int = 8
    cooldown_s: float = 5.0
    candidates: tuple[str, ...] = ("none", "ngram@4", "ngram@8", "ngram@16")  # for drafter 'auto': DRAFTER[@GAMMA]
    explore: float = 0.1  # share of 'auto' requests that try a candidate other than the best one

    def __post_init__(self) -> None:
        if not 0 < self.load_on <= self.load_off:
            raise ValueError("need 0 < load_on <= load_off")
        if not 0.0 <= self.canary_fraction <= 1.0:
            raise ValueError("canary_fraction must be in [0, 1]")
        if self.long_prompt_tokens < 1 or self.acceptance_window < 1 or self.probe_every < 1:
            raise ValueError("long_prompt_tokens, acceptance_window and probe_every must be >= 1")
        if not 0.0 <= self.explore <= 1.0:
            raise ValueError("explore must be in [0, 1]")
        if not self.candidates:
            raise ValueError("give at least one candidate for drafter 'auto'")
        for candidate in self.candidates:
            Choice.parse(candidate)


@dataclass(frozen=True)
class Choice:
    """A drafter and lookahead for one request; drafter None is plain decoding."""

    drafter: str | None
    gamma: int

    @classmethod
    def parse(cls, text: str) -> Choice:
        """'none' | 'DRAFTER' (gamma 8) | 'DRAFTER@GAMMA', e.g. 'ngram@16', 'early-exit:4@2'."""
        spec, _, gamma = text.partition("@")
        if spec in ("", "none"):
            return cls(None, 0)
        if gamma and not (gamma.isdigit() and 1 <= int(gamma) <= 64):
            raise ValueError(f"candidate {text!r}: gamma must be an integer in [1, 64]")
        return cls(spec, int(gamma or 8))

    def __str__(self) -> str:
        return f"{self.drafter}@{self.gamma}" if self.drafter else "none"


@dataclass(frozen=True)
class Decision:
    speculate: bool
    reason: str  # a telemetry.schema ModeReason
    arm: str | None = None


class Policy:
    """`telemetry`: where a change of the default mode goes, as a `mode_switch` event, when it happens."""

    def __init__(
        self, config: PolicyConfig = PolicyConfig(), seed: int | None = None, sink: TelemetrySink | None = None
    ) -> None:
        self.config = config
        self.sink = sink or TelemetrySink()
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self._override: tuple[Override, str] = ("auto", "manual")
        self._draft_loaded = True
        self._load = LoadSwitch(config.load_off, config.load_on, config.cooldown_s)
        self._acceptance: dict[str, deque[tuple[int, int]]] = {}
        self._fallback_count: dict[str, int] = {}
        self._goodput: dict[str, deque[float]] = {}  # drafter or 'plain' -> tokens per busy second
        self._load_probes = 0
        self.selector = Selector(
            [Choice.parse(c) for c in config.candidates], config.acceptance_window, config.explore, self._rng
        )

    def set_override(self, mode: Override, reason: str = "manual") -> None:
        with self._lock:
            self._override = (mode, reason)
        self._switched(mode != "autoregressive", reason, -1.0)

    def set_draft_loaded(self, loaded: bool) -> None:
        """False after the draft models were unloaded (memory pressure): their requests decode plainly."""
        with self._lock:
            self._draft_loaded = loaded

    @property
    def state(self) -> dict:
        with self._lock:
            return {
                "override": self._override[0],
                "override_reason": self._override[1],
                "load_allows_speculation": self._load.allows,
                "draft_loaded": self._draft_loaded,
                "selector": self.selector.summary(),
            }

    def decide(self, prompt_tokens: int, load: float, drafter: str | None, now: float | None = None) -> Decision:
        now = time.monotonic() if now is None else now
        with self._lock:
            switched = self._load.update(load, now)
            decision = self._decide(prompt_tokens, drafter)
        if switched is not None:
            self._switched(switched, "load", load)
        return decision

    def _decide(self, prompt_tokens: int, drafter: str | None) -> Decision:
        mode, reason = self._override
        if mode != "auto":
            return Decision(mode == "speculative", reason)
        if drafter is None:
            return Decision(False, "default")
        if not self._draft_loaded and drafter not in MODEL_FREE:
            return Decision(False, "memory")
        if prompt_tokens > self.config.long_prompt_tokens:
            return Decision(False, "long_prompt")
        if not self._load.allows and not self._pays_under_load(drafter):
            return Decision(False, "load")
        return self._canary_or_acceptance(drafter)

    def _pays_under_load(self, drafter: str) -> bool:
        spec, plain = self._goodput.get(drafter, ()), self._goodput.get("plain", ())
        measured = min(len(spec), len(plain)) >= self.config.min_window
        ratio = statistics.median(spec) / statistics.median(plain) if measured else 1.0
        conclusive = ratio >= 1.5 or ratio <= 1 / 1.5  # then probe 4x less often: probes cost throughput
        self._load_probes += 1
        if self._load_probes % (self.config.probe_every * (4 if conclusive else 1)) == 0:
            return False  # a plain probe: measures plain decoding under this load
        return ratio > 1.0 if measured else True  # not measured yet: keep speculating while probes collect evidence

    def _switched(self, speculate: bool, reason: str, load: float) -> None:
        """Reported outside the lock: a consumer may read `state`."""
        detail = {"to": "speculative" if speculate else "autoregressive", "reason": reason, "load": load}
        self.sink.emit("mode_switch", detail)

    def _canary_or_acceptance(self, drafter: str) -> Decision:
        if self.config.canary_fraction < 1.0:
            if self._rng.random() >= self.config.canary_fraction:
                return Decision(False, "canary", "control")
            return Decision(True, "canary", "spec")
        if self._acceptance_low(drafter):
            count = self._fallback_count[drafter] = self._fallback_count.get(drafter, 0) + 1
            if count % self.config.probe_every:
                return Decision(False, "low_acceptance")
        return Decision(True, "default")

    def _acceptance_low(self, drafter: str) -> bool:
        recent = self._acceptance.get(drafter)
        if not recent or len(recent) < self.config.min_window:
            return False
        drafted = sum(d for d, _ in recent)
        return drafted > 0 and sum(a for _, a in recent) / drafted < self.config.min_acceptance

    def choose(self, scenario: str) -> Choice:
        """The drafter and lookahead for a request that asked for drafter 'auto'."""
        with self._lock:
            return self.selector.choose(scenario)

    def observe(self, record: RequestRecord, choice: Choice | None = None) -> None:
        """Feed back a finished request: its goodput, and the acceptance of its drafter.
        `choice`: what the selector picked for it (an 'auto' request). A retried request (a speculative
        failure decoded again plainly, still recorded as speculative) gives no goodput: it measured neither."""
        busy_s = record.verify_s + record.draft_s  # model time after the first token
        with self._lock:
            if record.status == "ok" and not record.retries and record.output_tokens > 1 and busy_s > 0:
                goodput = (record.output_tokens - 1) / busy_s
                window = self._goodput.setdefault(
                    record.drafter or "plain", deque(maxlen=self.config.acceptance_window)
                )
                window.append(goodput)
                if choice is not None:  # credit what actually ran: plain decoding if the policy overruled the choice
                    ran = choice if record.mode == "speculative" else Choice(None, 0)
                    self.selector.observe(record.tags.get("scenario", ""), ran, goodput)
        if record.drafter is None or record.num_draft_tokens == 0:
            return
        with self._lock:
            window = self._acceptance.setdefault(record.drafter, deque(maxlen=self.config.acceptance_window))
            window.append((record.num_draft_tokens, record.num_accepted_tokens))


class Selector:
    """Per scenario, an epsilon-greedy bandit over (drafter, gamma) candidates.

    Reward: a request's goodput (tokens after the first per second of model time),
    kept over a sliding window per candidate so the choice follows changes in load
    and traffic. Every candidate is tried `min_tries` times first; afterwards an
    `explore` share of requests tries another candidate at random so all stay measured.
    """

    def __init__(
        self, candidates: list[Choice], window: int, explore: float, rng: random.Random, min_tries: int = 2
    ) -> None:
        self.candidates, self.explore, self.rng, self.min_tries = candidates, explore, rng, min_tries
        self.window = window
        self.rewards: dict[str, dict[Choice, deque[float]]] = {}

    def _of(self, scenario: str) -> dict[Choice, deque[float]]:
        return self.rewards.setdefault(scenario, {c: deque(maxlen=self.window) for c in self.candidates})

    def choose(self, scenario: str) -> Choice:
        rewards = self._of(scenario)
        untried = [c for c in self.candidates if len(rewards[c]) < self.min_tries]
        if untried:
            return min(untried, key=lambda c: len(rewards[c]))
        best = self.best(scenario)
        if len(self.candidates) > 1 and self.rng.random() < self.explore:
            return self.rng.choice([c for c in self.candidates if c != best])
        return best

    def best(self, scenario: str) -> Choice:
        rewards = self._of(scenario)
        return max(self.candidates, key=lambda c: statistics.fmean(rewards[c]) if rewards[c] else float("-inf"))

    def observe(self, scenario: str, choice: Choice, goodput: float) -> None:
        if choice in self.candidates:
            self._of(scenario)[choice].append(goodput)

    def summary(self) -> dict[str, dict[str, dict]]:
        """scenario -> candidate -> {'requests', 'goodput'}: what the control API's state shows."""
        return {
            scenario: {
                str(c): {"requests": len(r), "goodput": statistics.fmean(r) if r else None} for c, r in rewards.items()
            }
            for scenario, rewards in self.rewards.items()
        }
