"""Deploy markers for the gateway's upstreams: a `config` event, with the upstream's name as its instance,
when the gateway first sees an upstream's identity and whenever it changes (a vLLM restarted on another
version or another speculative config), so the collector's regression detector (alerts.regression)
compares acceptance before and after it.

The identity comes from the upstream's own endpoints: vLLM's `/version`, the served models of `/v1/models`
(ids, `max_model_len`, and any speculative settings a model card shows), and the number of draft
positions of its `/metrics` (`vllm:spec_decode_num_accepted_tokens_per_pos`: `num_speculative_tokens`,
0 without speculation) and its `engine` label values (`data_parallel_ranks`: the tuner emits no per-batch-size
schedule above 1). It is probed when an upstream is first healthy, when it comes back up (a restart)
and every `recheck_s` while it stays up; a failed probe changes nothing.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Iterable
from dataclasses import dataclass

import httpx
from prometheus_client.parser import text_string_to_metric_families

from specwatch.telemetry.schema import EngineEvent
from specwatch.telemetry.sink import TelemetrySink

log = logging.getLogger("specwatch.gateway")
RECHECK_S = 60.0
TIMEOUT_S = 2.0
POSITION = re.compile(r'^vllm:spec_decode_num_accepted_tokens_per_pos_total\{[^}]*position="(\d+)"', re.M)


@dataclass
class _Seen:
    detail: dict | None = None
    probed_at: float = 0.0
    healthy: bool = False


def speculative_settings(card: dict) -> dict:
    """A model card's speculative settings, whatever the server names them (keys holding 'specul')."""
    return {k: v for k, v in card.items() if "specul" in k.lower()}


def data_parallel_ranks(metrics_text: str) -> int:
    """How many engines vLLM's /metrics reports for (its `engine` label: one per data-parallel rank); 0 when
    none. Above 1, vLLM drops `num_speculative_tokens_per_batch_size` and runs static k."""
    try:
        families = list(text_string_to_metric_families(metrics_text))
    except ValueError:  # not an exposition: no engines to count
        return 0
    engines = {
        s.labels["engine"] for f in families if f.name.startswith("vllm:") for s in f.samples if "engine" in s.labels
    }
    return len(engines)


def draft_positions(metrics_text: str) -> int:
    """How many draft positions vLLM counts acceptance for: its num_speculative_tokens (0: no speculation)."""
    return len(set(POSITION.findall(metrics_text)))


async def identify(http: httpx.AsyncClient, url: str, timeout: float) -> dict | None:
    """The upstream's identity, or None when its /version does not answer 200 with JSON."""
    version = await http.get(f"{url}/version", timeout=timeout)
    if version.status_code != 200:
        return None
    models = await http.get(f"{url}/v1/models", timeout=timeout)
    cards = models.json().get("data", []) if models.status_code == 200 else []
    metrics = await http.get(f"{url}/metrics", timeout=timeout)
    detail = {
        "version": version.json().get("version"),
        "model": ",".join(sorted(str(c.get("id")) for c in cards)),
        "max_model_len": next((c.get("max_model_len") for c in cards if "max_model_len" in c), None),
        "num_speculative_tokens": draft_positions(metrics.text) if metrics.status_code == 200 else None,
        "data_parallel_ranks": data_parallel_ranks(metrics.text) if metrics.status_code == 200 else None,
    }
    for card in cards:
        detail |= speculative_settings(card)
    return detail


class UpstreamMarkers:
    """The identity last seen per upstream; `check_all` after each health check emits what changed."""

    def __init__(self, sink: TelemetrySink, recheck_s: float = RECHECK_S) -> None:
        self.sink, self.recheck_s = sink, recheck_s
        self.seen: dict[str, _Seen] = {}

    def version(self, name: str) -> str | None:
        """The upstream's version as its /version last said (None before its first probe)."""
        seen = self.seen.get(name)
        found = seen.detail.get("version") if seen and seen.detail else None
        return found if isinstance(found, str) else None

    def due(self, name: str, healthy: bool, now: float) -> bool:
        seen = self.seen.setdefault(name, _Seen())
        came_up, seen.healthy = healthy and not seen.healthy, healthy
        return healthy and (came_up or now - seen.probed_at >= self.recheck_s)

    async def check_all(self, http: httpx.AsyncClient, states: Iterable, timeout: float = TIMEOUT_S) -> None:
        now = time.time()
        due = [s for s in states if self.due(s.upstream.name, s.healthy, now)]
        found = await asyncio.gather(*(identify(http, s.upstream.url, timeout) for s in due), return_exceptions=True)
        for state, detail in zip(due, found, strict=True):
            if isinstance(detail, dict):
                self.record(state.upstream.name, detail, now)

    def record(self, name: str, detail: dict, now: float) -> None:
        seen = self.seen[name]
        seen.probed_at = now
        if detail != seen.detail:
            seen.detail = detail
            marker = {**detail, "role": "upstream", "gateway": self.sink.instance}
            try:
                self.sink.put(EngineEvent(instance=name, at=now, kind="config", detail=marker))
            except ValueError:  # a detail over the contract's limits (a server's odd model card)
                log.exception("dropped the config marker of upstream %s", name)
