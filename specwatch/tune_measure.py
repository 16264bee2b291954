"""What `specwatch tune profile` measured, as the profile JSON `cost.tuner_data.read_profile` reads:

    {"source": "...", "made_at": epoch s, "made_at_utc": "...", "upstream_version": "0.32.0",
     "upstreams": [{"url", "version", "model", "k", "speculative"}],
     "workload": {"kinds": [...], "max_tokens": N},
     "levels": {"<batch>": {"<k>": seconds per step, ...}},
     "acceptance": {"<batch>": {"rates": [a_0, ...], "draft_rate": q, "requests": n, "drafts": d}},
     "measured": [{"url", "k", "concurrency", "level", "requests", "output_tokens", "tokens_per_s",
                   "ms_per_token", "seconds_per_step", "draft_tokens_per_step"}, ...]}

The formulas are `specwatch.tune_profile`'s docstring; acceptance goes through the tuner's own reading of
records (`collector.reads.tuning_reads.rows_from_tuples`, `cost.tuner_data.acceptance`), not a copy of it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np

from specwatch.collector.reads.tuning_reads import rows_from_tuples
from specwatch.cost.attribution import levels
from specwatch.cost.tuner_data import acceptance
from specwatch.gateway.records import DraftCounts
from specwatch.workload import PROMPTS


@dataclass(frozen=True)
class Server:
    url: str
    version: str | None  # its /version
    model: str
    k: int  # draft positions of its /metrics (0: none seen)
    settings: dict  # speculative settings its model cards show


@dataclass(frozen=True)
class Answer:
    url: str
    concurrency: int
    k: int  # the response's num_spec_tokens (0: no speculative_decoding)
    started_at: float  # epoch s
    wall_s: float  # client-side latency
    output_tokens: int
    generation_s: float  # the server's generation_time_ms: first token to last
    counts: DraftCounts | None
    part: int = 0  # the pass over the servers it was sent in

    @property
    def level(self) -> int:
        return int(levels(np.array([float(self.concurrency)]))[0])

    @property
    def steps(self) -> int:
        """Forwards after the first token: each commits 1 + accepted tokens."""
        return max(self.output_tokens - 1 - (self.counts.num_accepted_tokens if self.counts else 0), 0)


def server_ks(servers: list[Server], answers: list[Answer]) -> dict[str, int]:
    """Each server's k: the most its responses said they drafted, else its /metrics draft positions."""
    return {s.url: max((a.k for a in answers if a.url == s.url), default=s.k) or s.k for s in servers}


def step_costs(answers: list[Answer], ks: dict[str, int]) -> dict[str, dict[str, float]]:
    """{"<level>": {"<k>": Σ generation s / Σ steps}} over every server's requests at the level."""
    found: dict[str, dict[str, float]] = {}
    for level in sorted({a.level for a in answers}):
        for k in sorted({ks[a.url] for a in answers if a.level == level}):
            picked = [a for a in answers if a.level == level and ks[a.url] == k]
            steps = sum(a.steps for a in picked)
            if steps:
                found.setdefault(str(level), {})[str(k)] = sum(a.generation_s for a in picked) / steps
    return found


def _row(answer: Answer) -> tuple:
    """The answer as a tuple in `collector.reads.tuning_reads` column order (decode time = generation time)."""
    c = answer.counts or DraftCounts()
    mode = "speculative" if answer.counts else "autoregressive"
    return (answer.url, mode, "profiled" if answer.counts else None, answer.started_at, 0.0, 0.0,
            answer.generation_s, answer.output_tokens, c.num_drafts, c.num_draft_tokens, c.num_accepted_tokens,
            c.gamma, 0.0, 0.0, answer.counts is not None, list(c.accepted_per_position),
            list(c.drafts_per_position))  # fmt: skip


def acceptances(answers: list[Answer]) -> dict[str, dict]:
    """{"<level>": {"rates", "draft_rate", "requests", "drafts", "from"}} from the speculative answers at each
    level ("from": which counts the rates divide, as `cost.tuner_data.reach_source` names them)."""
    found = {}
    for level in sorted({a.level for a in answers}):
        picked = [a for a in answers if a.level == level and a.counts is not None]
        measured = acceptance(rows_from_tuples([_row(a) for a in picked]), np.ones(len(picked))) if picked else None
        if measured is not None:
            found[str(level)] = {"rates": [round(r, 6) for r in measured.rates], "draft_rate": measured.draft_rate,
                                 "requests": measured.requests, "drafts": measured.drafts,
                                 "from": measured.source.removeprefix("records: ")}  # fmt: skip
    return found


def _span(answers: list[Answer]) -> float:
    """Wall time from the first request's start to the last one's end."""
    return max(a.started_at + a.wall_s for a in answers) - min(a.started_at for a in answers)


def measured_rows(answers: list[Answer], ks: dict[str, int]) -> list[dict]:
    """Client-side tokens/s and ms/token per server and concurrency (module docstring)."""
    rows = []
    for url, concurrency in sorted({(a.url, a.concurrency) for a in answers}, key=lambda x: (x[1], ks[x[0]])):
        picked = [a for a in answers if a.url == url and a.concurrency == concurrency]
        tokens, steps = sum(a.output_tokens for a in picked), sum(a.steps for a in picked)
        span = sum(_span([a for a in picked if a.part == part]) for part in {a.part for a in picked})
        drafted = sum(a.counts.num_draft_tokens for a in picked if a.counts)
        rows.append({"url": url, "k": ks[url], "concurrency": concurrency, "level": picked[0].level,
                     "requests": len(picked), "output_tokens": tokens, "tokens_per_s": tokens / span if span else None,
                     "ms_per_token": 1000 * sum(a.wall_s for a in picked) / max(tokens, 1),
                     "seconds_per_step": sum(a.generation_s for a in picked) / steps if steps else None,
                     "draft_tokens_per_step": drafted / steps if steps else 0.0})  # fmt: skip
    return rows


def profile_json(servers: list[Server], answers: list[Answer], concurrency, max_tokens: int) -> dict:
    """The profile (module docstring)."""
    ks, now = server_ks(servers, answers), time.time()
    versions = sorted({s.version for s in servers if s.version})
    listed = ", ".join(f"k={ks[s.url]}" for s in servers)
    return {
        "source": f"specwatch tune profile: {len(servers)} server(s) ({listed}) at concurrency "
        + ",".join(map(str, concurrency)),
        "made_at": now,
        "made_at_utc": datetime.fromtimestamp(now, UTC).isoformat(timespec="seconds"),
        "upstream_version": ", ".join(versions) or None,
        "upstreams": [
            {"url": s.url, "version": s.version, "model": s.model, "k": ks[s.url], "speculative": s.settings}
            for s in servers
        ],  # fmt: skip
        "workload": {"kinds": list(PROMPTS), "max_tokens": max_tokens},
        "levels": step_costs(answers, ks),
        "acceptance": acceptances(answers),
        "measured": measured_rows(answers, ks),
    }


def summary_lines(found: dict) -> list[str]:
    """The measured rows as a table, then each level's acceptance."""
    lines = [f"{'c':>3} {'k':>3} {'tokens/s':>9} {'ms/token':>9} {'ms/step':>8} {'draft tok/step':>14}  upstream"]
    for row in found["measured"]:
        per_s = "-" if row["tokens_per_s"] is None else f"{row['tokens_per_s']:.1f}"
        step = "-" if row["seconds_per_step"] is None else f"{1000 * row['seconds_per_step']:.1f}"
        lines.append(f"{row['concurrency']:>3} {row['k']:>3} {per_s:>9} {row['ms_per_token']:>9.1f} {step:>8} "
                     f"{row['draft_tokens_per_step']:>14.2f}  {row['url']}")  # fmt: skip
    for level, entry in found["acceptance"].items():
        rates = " ".join(f"{a:.2f}" for a in entry["rates"])
        lines.append(f"acceptance at batch {level}: a_i {rates}; q {entry['draft_rate']:.2f} "
                     f"({entry['requests']:.0f} requests, {entry['drafts']:.0f} drafts)")  # fmt: skip
    return lines
