"""`specwatch tune profile`: measure real servers' step cost t(b, k) and acceptance, as the profile that
`specwatch tune recommend --profile` reads (`cost.tuner_data.read_profile`).

specwatch tune profile --upstream URL [--upstream URL2 ...] [--concurrency 1,4,8] [--requests N]
    [--max-tokens N] [--model NAME] [--timeout SECONDS] [--out profile.json]

A bounded sweep of concurrency x k: at each concurrency c, each upstream gets one warm-up request, then
`--requests` chat requests of the mixed workload (`specwatch.workload.PROMPTS`, greedy), c in flight at a
time, in `--passes` passes that alternate between the upstreams (the order rotates), so a shared machine's
drift hits every server alike. A progress bar goes to stderr.

Each server runs only the k it was started with: profiling a `num_speculative_tokens` needs a server
started with it. Give one server per k (a plain one, k = 0, among them: vLLM without
`--speculative-config`). Each server's identity is what the gateway's deploy markers read
(`gateway.markers`): `/version`, the model cards of `/v1/models` and the draft positions of `/metrics`;
its responses' `metrics.speculative_decoding.num_spec_tokens` settles k. The servers must return
per-request metrics (vLLM: `--enable-per-request-metrics`, with speculation also
`--per-request-spec-decode-metrics summary`; the bundled engine always does).

From the responses, per bucket level (`cost.attribution.levels` of c):
    step cost    t(b, k) = Σ generation time / Σ steps over the server's requests, steps = output tokens
                 - 1 - accepted (the forwards after the first token); keyed by the server's k, so a
                 drafter that drafts in only some steps (n-gram: q < 1) is costed as it runs
    acceptance   a_i and q pooled over the speculative servers, as the tuner reads records
                 (`cost.tuner_data.acceptance`, from vLLM's per-request acceptance_histogram)
    measured     client-side tokens/s (Σ output tokens / Σ wall time of its passes) and ms/token (Σ request
                 latency / Σ output tokens) per server, for the table this prints
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

import httpx
import numpy as np

from specwatch.common.errors import UsageError
from specwatch.gateway.markers import draft_positions, speculative_settings
from specwatch.gateway.records import DraftCounts, draft_counts
from specwatch.tune_measure import Answer, Server, profile_json, summary_lines
from specwatch.workload import PROMPTS, chat

KINDS = tuple(PROMPTS)
RESTART_HINT = (
    "start vLLM with --enable-per-request-metrics (and, with speculation, --per-request-spec-decode-metrics summary)"
)


@dataclass(frozen=True)
class ProfileConfig:
    upstreams: tuple[str, ...]
    concurrency: tuple[int, ...] = (1, 4, 8)
    requests: int = 24  # per upstream and concurrency level, after one warm-up request
    max_tokens: int = 64
    model: str | None = None  # default: each server's first model card
    timeout_s: float = 300.0
    api_key: str | None = None
    warmups: int = 1  # requests per server and level before the measured ones
    passes: int = 2  # alternating passes over the servers per level


def concurrency_list(value: str) -> tuple[int, ...]:
    """'1,4,8' -> (1, 4, 8): distinct whole numbers 1..256, each in its own bucket level."""
    from specwatch.cost.attribution import levels

    parts = [p.strip() for p in value.split(",") if p.strip()]
    if not parts or not all(p.isdigit() and 1 <= int(p) <= 256 for p in parts):
        raise argparse.ArgumentTypeError(f"want whole numbers from 1 to 256 separated by commas, got {value!r}")
    found = tuple(sorted({int(p) for p in parts}))
    buckets = [int(b) for b in levels(np.array(found, dtype=float))]
    if len(set(buckets)) < len(buckets):
        raise argparse.ArgumentTypeError(f"{value!r}: two of them fall in the same batch-size bucket ({buckets})")
    return found


def _requests(value: str) -> int:
    if not value.isdigit() or not 1 <= int(value) <= 10_000:
        raise argparse.ArgumentTypeError(f"want a whole number from 1 to 10000, got {value!r}")
    return int(value)


def register_profile(actions: argparse._SubParsersAction) -> None:
    profile = actions.add_parser(
        "profile",
        help="measure servers' step cost per batch size and k (one server per k: a k needs a server started with it)",
        description=__doc__.split("\n\n")[2] + "\n\n" + __doc__.split("\n\n")[3],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    one_per_k = "an OpenAI-compatible server (repeat: one per num_speculative_tokens, a plain one too)"
    profile.add_argument("--upstream", metavar="URL", action="append", required=True, help=one_per_k)
    profile.add_argument("--concurrency", type=concurrency_list, default=(1, 4, 8), help="levels (default 1,4,8)")
    profile.add_argument(
        "--requests",
        type=_requests,
        default=ProfileConfig.requests,
        help="per server and level (default 24; the tuner wants 20 speculative requests a level)",
    )
    profile.add_argument("--passes", type=_requests, default=ProfileConfig.passes,
                         help="alternating passes over the servers per level (default 2)")  # fmt: skip
    profile.add_argument("--max-tokens", type=_requests, default=64, help="per request (default 64)")
    profile.add_argument("--model", default=None, help="model name to request (default: each server's first)")
    profile.add_argument("--timeout", type=float, default=300.0, help="seconds per request (default 300)")
    profile.add_argument("--api-key", default=None, help="bearer key for the servers (default: none)")
    profile.add_argument("--out", type=Path, default=Path("profile.json"), help="where to write the profile JSON")
    profile.set_defaults(handler=profile_command)


def profile_command(args: argparse.Namespace) -> int:
    if args.timeout <= 0:
        raise UsageError("--timeout: want seconds > 0")
    config = ProfileConfig(tuple(u.rstrip("/") for u in args.upstream), args.concurrency, args.requests,
                           args.max_tokens, args.model, args.timeout, args.api_key, passes=args.passes)  # fmt: skip
    if len(set(config.upstreams)) < len(config.upstreams):
        raise UsageError("--upstream: the same URL twice")
    found = asyncio.run(profile(config))
    try:
        args.out.write_text(json.dumps(found, indent=2) + "\n")
    except OSError as exc:
        raise UsageError(f"--out {args.out}: {exc.strerror or exc}") from None
    print("\n".join(summary_lines(found)))
    print(f"profile written to {args.out} (read it with `specwatch tune recommend --profile {args.out}`)")
    return 0


async def profile(config: ProfileConfig, progress=None) -> dict:
    """Identify every server, run the sweep, and return the profile JSON (`specwatch.tune_measure`)."""
    headers = {"Authorization": f"Bearer {config.api_key}"} if config.api_key else {}
    async with httpx.AsyncClient(headers=headers, timeout=config.timeout_s) as client:
        servers = [await identify(client, url, config.model) for url in config.upstreams]
        total = len(servers) * len(config.concurrency) * (config.requests + config.warmups)
        bar = Bar(total, progress or sys.stderr)  # looked up now: a default bound at import outlives a swap
        answers: list[Answer] = []
        for turn, level in enumerate(config.concurrency):
            for part, numbers in enumerate(passes(config.requests, config.passes)):
                shift = (turn + part) % len(servers)
                for server in servers[shift:] + servers[:shift]:
                    answers += await run_level(client, server, level, config, bar, numbers, part)
        bar.close()
    return profile_json(servers, answers, config.concurrency, config.max_tokens)


async def identify(client: httpx.AsyncClient, url: str, model: str | None) -> Server:
    """The server's model, version and k as its endpoints tell them (module docstring); UsageError when down."""
    try:
        models = await client.get(f"{url}/v1/models", timeout=10)
        cards = models.json().get("data") if models.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError) as exc:
        raise UsageError(f"--upstream {url}: cannot read its /v1/models ({type(exc).__name__}: {exc})") from None
    if not isinstance(cards, list) or not cards or not all(isinstance(c, dict) for c in cards):
        raise UsageError(f"--upstream {url}: /v1/models answered {models.status_code} without model cards")
    version = (await _optional(client, f"{url}/version", lambda r: r.json().get("version"))) or None
    positions = await _optional(client, f"{url}/metrics", lambda r: draft_positions(r.text))
    settings = {k: v for card in cards for k, v in speculative_settings(card).items()}
    return Server(url, None if version is None else str(version), model or str(cards[0].get("id")),
                  positions or 0, settings)  # fmt: skip


async def _optional(client: httpx.AsyncClient, url: str, read):
    """read(response) of a 200 answer, else None (a server without that endpoint)."""
    try:
        response = await client.get(url, timeout=10)
        return read(response) if response.status_code == 200 else None
    except (httpx.HTTPError, ValueError, AttributeError):
        return None


def passes(requests: int, count: int) -> list[range]:
    """The request numbers 0..requests-1 in `count` consecutive non-empty parts."""
    parts = (range(i * requests // count, (i + 1) * requests // count) for i in range(count))
    return [part for part in parts if len(part)]


async def run_level(
    client, server: Server, level: int, config: ProfileConfig, bar: Bar, numbers: range | None = None, part: int = 0
) -> list[Answer]:
    """Pass `part` at one level: `config.warmups` requests first (pass 0), then requests `numbers` (default: all
    `config.requests`) with `level` in flight; the answers."""
    for number in range(-config.warmups if part == 0 else 0, 0):
        await ask(client, server, level, number, config)
        bar.tick(f"{server.url} c={level}")
    numbers, answers = iter(range(config.requests) if numbers is None else numbers), []

    async def worker():
        for number in numbers:  # one iterator shared by the workers: each request is sent once
            answers.append(replace(await ask(client, server, level, number, config), part=part))
            bar.tick(f"{server.url} c={level}")

    await asyncio.gather(*(worker() for _ in range(level)))
    return answers


async def ask(client, server: Server, concurrency: int, number: int, config: ProfileConfig) -> Answer:
    """One greedy chat request (kind by number); its timings and draft counts from the response."""
    body = {"model": server.model, "messages": chat(KINDS[number % len(KINDS)]), "max_tokens": config.max_tokens,
            "temperature": 0, "seed": number}  # fmt: skip
    started, clock = time.time(), time.monotonic()
    try:
        response = await client.post(f"{server.url}/v1/chat/completions", json=body)
    except httpx.HTTPError as exc:
        raise UsageError(f"--upstream {server.url}: request failed ({type(exc).__name__}: {exc})") from None
    if response.status_code != 200:
        raise UsageError(f"--upstream {server.url}: answered {response.status_code}: {response.text[:200]}")
    return answer_of(server, concurrency, response.json(), started, time.monotonic() - clock)


def answer_of(server: Server, concurrency: int, payload: dict, started: float, wall_s: float) -> Answer:
    """An Answer from a chat completion with per-request metrics; UsageError without them."""
    metrics, usage = payload.get("metrics"), payload.get("usage") or {}
    generation = metrics.get("generation_time_ms") if isinstance(metrics, dict) else None
    if type(generation) not in (int, float) or type(usage.get("completion_tokens")) is not int:
        raise UsageError(f"--upstream {server.url}: its responses carry no per-request metrics: {RESTART_HINT}")
    spec = metrics.get("speculative_decoding")
    counts = draft_counts(spec)
    if counts is None and server.k:
        raise UsageError(f"--upstream {server.url}: speculative (k={server.k}) without per-request "
                         f"speculative_decoding metrics: {RESTART_HINT}")  # fmt: skip
    k = spec.get("num_spec_tokens") if counts is not None else 0
    k = k if type(k) is int and k >= 0 else (counts or DraftCounts()).gamma
    return Answer(server.url, concurrency, k, started, wall_s, usage["completion_tokens"], generation / 1000.0, counts)


class Bar:
    """A one-line progress bar on `out` (stderr): done/total, elapsed time and what runs now."""

    def __init__(self, total: int, out, width: int = 30) -> None:
        self.total, self.out, self.width, self.done, self.started = total, out, width, 0, time.monotonic()

    def tick(self, what: str) -> None:
        self.done += 1
        filled = self.width * self.done // max(self.total, 1)
        elapsed = time.monotonic() - self.started
        line = f"\r[{'#' * filled}{'.' * (self.width - filled)}] {self.done}/{self.total} {elapsed:5.0f} s  {what}"
        print(line[:150].ljust(110), end="", file=self.out, flush=True)

    def close(self) -> None:
        print(file=self.out, flush=True)
