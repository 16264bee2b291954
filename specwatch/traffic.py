"""`specwatch traffic`: a load generator that drives an engine through its OpenAI API.

Scenarios are the sample prompts of `specwatch.workload` (chat, grounded repeat, summary,
code edit, extraction from a context, long context > 512 tokens), tagged so the
collector can split by scenario. Arrivals are either a fixed number of concurrent
clients or a Poisson process; the run is bounded by --duration and --requests.
Time to first token is measured client-side at the first streamed chunk. A failed request
(refused connection, 5xx, 429, ...) pauses the next one, doubling from 0.1 s to 5 s while failures
run on; 20 consecutive failures, or 30 s of nothing but failures, end the run with one line.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import sys
import time
from dataclasses import dataclass, field

import httpx
import numpy as np

from specwatch.common.auth import first_token
from specwatch.common.cli import API_KEY_ENV
from specwatch.workload import PROMPTS


@dataclass(frozen=True)
class TrafficConfig:
    url: str
    scenarios: tuple[str, ...]
    duration_s: float = 30.0
    max_requests: int = 1000
    concurrency: int = 4
    rate: float | None = None  # Poisson arrivals per second; None: fixed concurrency
    max_tokens: int = 64
    drafter: str | None = "ngram"
    temperature: float = 0.0
    seed: int = 0
    max_failures: int = 20  # consecutive failed requests that end the run
    give_up_s: float = 30.0  # ... or this long with failures only
    backoff_s: tuple[float, float] = (0.1, 5.0)  # pause after a failure: first, cap


@dataclass
class Outcome:
    scenario: str
    ok: bool
    ttft_s: float | None = None
    e2e_s: float = 0.0
    tokens: int = 0
    error: str | None = None


@dataclass
class Tally:
    outcomes: list[Outcome] = field(default_factory=list)
    started: float = field(default_factory=time.monotonic)
    stopped: str | None = None  # why the run gave up early, if it did


@dataclass
class Backoff:
    """Consecutive failures across all clients: the pause before the next request doubles with each
    (capped); a success resets it. A target that is down costs a few requests, not thousands."""

    config: TrafficConfig
    failures: int = 0
    failing_since: float = 0.0
    delay_s: float = 0.0
    last_error: str | None = None

    def record(self, outcome: Outcome) -> None:
        if outcome.ok:
            self.failures, self.delay_s = 0, 0.0
            return
        if self.failures == 0:
            self.failing_since = time.monotonic()
        self.failures += 1
        self.last_error = outcome.error
        first, cap = self.config.backoff_s
        self.delay_s = min(cap, first * 2 ** (self.failures - 1))

    def give_up(self) -> str | None:
        """The one line that ends the run, once failures have run on too long."""
        failing_s = time.monotonic() - self.failing_since
        if self.failures and (self.failures >= self.config.max_failures or failing_s >= self.config.give_up_s):
            return (
                f"traffic: stopped after {self.failures} consecutive failures in {failing_s:.0f} s "
                f"(last: {self.last_error}); is the engine at {self.config.url} running?"
            )
        return None


async def one_request(http: httpx.AsyncClient, config: TrafficConfig, scenario: str, tag: str | None = None) -> Outcome:
    """One streamed request of `scenario`'s prompt, tagged `scenario: <tag or scenario>`."""
    body = {
        "messages": [{"role": "user", "content": PROMPTS[scenario]}],
        "max_tokens": config.max_tokens,
        "temperature": config.temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
        "drafter": config.drafter or "none",
        "tags": {"scenario": tag or scenario},
    }
    started, ttft, tokens = time.monotonic(), None, 0
    try:
        async with http.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                await response.aread()
                return Outcome(scenario, False, e2e_s=time.monotonic() - started, error=f"HTTP {response.status_code}")
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                chunk = json.loads(line[6:])
                if "error" in chunk:
                    return Outcome(
                        scenario, False, e2e_s=time.monotonic() - started, error=chunk["error"]["message"][:80]
                    )
                if ttft is None and chunk["choices"] and chunk["choices"][0]["delta"].get("content"):
                    ttft = time.monotonic() - started
                tokens = (chunk.get("usage") or {}).get("completion_tokens", tokens)
    except httpx.HTTPError as exc:
        return Outcome(scenario, False, e2e_s=time.monotonic() - started, error=type(exc).__name__)
    return Outcome(scenario, True, ttft, time.monotonic() - started, tokens)


async def run_traffic(config: TrafficConfig, progress=sys.stderr, tally: Tally | None = None) -> Tally:
    """Run the traffic; `tally` (new if None) holds the outcomes so far even if the run is cancelled."""
    rng, tally, backoff = random.Random(config.seed), tally or Tally(), Backoff(config)
    deadline = tally.started + config.duration_s
    issued = 0

    def next_scenario() -> str | None:
        nonlocal issued
        tally.stopped = tally.stopped or backoff.give_up()
        if issued >= config.max_requests or time.monotonic() >= deadline or tally.stopped:
            return None
        issued += 1
        return rng.choice(config.scenarios)

    key = first_token(os.environ.get(API_KEY_ENV))  # an engine or gateway started with --api-key wants it
    headers = {"authorization": f"Bearer {key}"} if key else None
    async with httpx.AsyncClient(base_url=config.url, timeout=httpx.Timeout(600, connect=10), headers=headers) as http:
        reporter = asyncio.create_task(_report_progress(tally, config, progress))
        try:
            if config.rate:
                await _poisson(http, config, tally, backoff, next_scenario, rng)
            else:
                clients = (_closed_loop(http, config, tally, backoff, next_scenario) for _ in range(config.concurrency))
                await asyncio.gather(*clients)
        finally:
            reporter.cancel()
    if tally.stopped:
        print(tally.stopped, file=progress, flush=True)
    return tally


async def _closed_loop(http, config, tally: Tally, backoff: Backoff, next_scenario) -> None:
    while (scenario := next_scenario()) is not None:
        outcome = await one_request(http, config, scenario)
        tally.outcomes.append(outcome)
        backoff.record(outcome)
        if not outcome.ok and not backoff.give_up():
            await asyncio.sleep(backoff.delay_s)


async def _poisson(http, config, tally: Tally, backoff: Backoff, next_scenario, rng: random.Random) -> None:
    def done(task: asyncio.Task) -> None:
        if task.cancelled():
            return
        tally.outcomes.append(task.result())
        backoff.record(task.result())

    tasks = []
    while (scenario := next_scenario()) is not None:
        tasks.append(asyncio.create_task(one_request(http, config, scenario)))
        tasks[-1].add_done_callback(done)
        await asyncio.sleep(max(rng.expovariate(config.rate), backoff.delay_s))
    await asyncio.gather(*tasks)


async def _report_progress(tally: Tally, config: TrafficConfig, out) -> None:
    while True:
        await asyncio.sleep(2.0)
        elapsed = time.monotonic() - tally.started
        done = len(tally.outcomes)
        errors = sum(not o.ok for o in tally.outcomes)
        tokens = sum(o.tokens for o in tally.outcomes)
        print(
            f"  {elapsed:5.0f}/{config.duration_s:.0f}s  {done} done ({errors} errors)  "
            f"{done / elapsed:.2f} req/s  {tokens / elapsed:.1f} tok/s",
            file=out,
            flush=True,
        )


def summary(tally: Tally) -> list[dict]:
    """Per scenario and overall: requests, errors, throughput, TTFT and e2e percentiles."""
    elapsed = time.monotonic() - tally.started
    groups = {"all": tally.outcomes} | {
        s: [o for o in tally.outcomes if o.scenario == s] for s in sorted({o.scenario for o in tally.outcomes})
    }
    return [_summarise(name, outcomes, elapsed) for name, outcomes in groups.items()]


def _summarise(name: str, outcomes: list[Outcome], elapsed: float) -> dict:
    ok = [o for o in outcomes if o.ok]
    ttft = np.array([o.ttft_s for o in ok if o.ttft_s is not None])
    e2e = np.array([o.e2e_s for o in ok])

    def pct(values: np.ndarray, q: float) -> float | None:
        return float(np.percentile(values, q)) if values.size else None

    return {
        "scenario": name,
        "requests": len(outcomes),
        "errors": len(outcomes) - len(ok),
        "output_tokens_per_s": sum(o.tokens for o in ok) / max(elapsed, 1e-9),
        "ttft_p50_s": pct(ttft, 50),
        "ttft_p99_s": pct(ttft, 99),
        "e2e_p50_s": pct(e2e, 50),
        "e2e_p99_s": pct(e2e, 99),
        "errors_seen": sorted({o.error for o in outcomes if o.error})[:5],
    }


def print_summary(rows: list[dict], out=sys.stdout) -> None:
    def ms(value: float | None) -> str:
        return "-" if value is None else f"{1000 * value:.0f}"

    print(
        f"{'scenario':<13} {'requests':>8} {'errors':>6} {'tok/s':>7} "
        f"{'TTFT p50':>9} {'TTFT p99':>9} {'e2e p50':>8} {'e2e p99':>8}  (ms)",
        file=out,
    )
    for row in rows:
        print(
            f"{row['scenario']:<13} {row['requests']:>8} {row['errors']:>6} {row['output_tokens_per_s']:>7.1f} "
            f"{ms(row['ttft_p50_s']):>9} {ms(row['ttft_p99_s']):>9} "
            f"{ms(row['e2e_p50_s']):>8} {ms(row['e2e_p99_s']):>8}",
            file=out,
        )
        if row["errors_seen"]:
            print(f"{'':<13} errors: {', '.join(row['errors_seen'])}", file=out)
