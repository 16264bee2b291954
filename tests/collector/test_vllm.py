"""vLLM scrape: parse its exposition, turn scrapes into deltas across counter resets, answer queries."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
from fake_vllm import TTFT_BUCKETS, FakeVllm
from fastapi.testclient import TestClient
from prometheus_client import start_http_server
from waiting import wait_for

from specwatch.collector.ingest.vllm import Scraper, parse, vllm_signals
from specwatch.collector.reads.history import histogram_quantile
from specwatch.collector.reads.queries import Window
from specwatch.collector.settings import Settings
from specwatch.common.procs import free_port
from specwatch.service.app import create_app

FIXTURE = Path(__file__).parent / "fixtures" / "vllm_metrics.txt"
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def test_parses_vllm_exposition_per_model_and_engine():
    snaps = parse(FIXTURE.read_text())
    assert set(snaps) == {(MODEL, "0"), (MODEL, "1")}
    e0 = snaps[(MODEL, "0")]
    assert e0.counters == {"drafts": 7.0, "draft_tokens": 21.0, "accepted_tokens": 14.0}
    assert e0.per_position == {0: 6.0, 1: 5.0, 2: 3.0}
    assert e0.buckets["ttft"][0.04] == 1.0 and e0.buckets["ttft"][float("inf")] == 3.0
    assert e0.sums["e2e"] == pytest.approx(6.1)
    assert len(e0.created) == 3 + 3 + 2  # three counters, three positions, two histograms


def test_first_scrape_is_a_baseline_then_deltas(db):
    vllm, scraper = FakeVllm(), Scraper("http://vllm:8000/metrics", db, 15)
    for accepted in (3, 2):
        vllm.observe_draft(accepted)
    assert scraper.observe(vllm.text(), at=1000.0) == []
    for accepted in (3, 1, 0):
        vllm.observe_draft(accepted)
    vllm.observe_request(0.05, 1.1)
    [row] = scraper.observe(vllm.text(), at=1015.0)
    assert (row["drafts"], row["draft_tokens"], row["accepted_tokens"], row["interval_s"]) == (3, 9, 4, 15.0)
    assert row["accepted_per_position"] == [2, 1, 1] and not row["counter_reset"]
    assert sum(row["ttft_counts"]) == 1 and row["ttft_bounds"] == TTFT_BUCKETS


def test_counter_reset_counts_from_zero(db):
    scraper = Scraper("http://vllm:8000/metrics", db, 15)
    before = FakeVllm()
    for _ in range(10):
        before.observe_draft(3)
    scraper.observe(before.text(), at=1000.0)
    time.sleep(0.01)  # a different _created
    restarted = FakeVllm()
    for _ in range(20):  # every counter above its old value: only _created reveals the restart
        restarted.observe_draft(3)
    [row] = scraper.observe(restarted.text(), at=1015.0)
    assert row["counter_reset"] and (row["drafts"], row["accepted_tokens"]) == (20, 60)
    restarted2 = FakeVllm()
    restarted2.observe_draft(2)
    [row] = scraper.observe(restarted2.text(), at=1030.0)  # fewer than before: counters went down
    assert row["counter_reset"] and (row["drafts"], row["accepted_per_position"]) == (1, [1, 1, 0])


def test_signals_from_scrapes(db):
    rng = np.random.default_rng(5)
    vllm, scraper = FakeVllm(), Scraper("http://vllm:8000/metrics", db, 15)
    scraper.observe(vllm.text(), at=1000.0)
    accepted = rng.integers(0, 4, 300)
    ttfts = rng.gamma(2.0, 0.03, 300)
    for i, a in enumerate(accepted):
        vllm.observe_draft(int(a))
        vllm.observe_request(float(ttfts[i]), float(ttfts[i] + 1.0))
        if i % 100 == 99:
            scraper.observe(vllm.text(), at=1000.0 + 15 * (i // 100 + 1))
    got = vllm_signals(db, Window(1000, 1100))
    assert got.intervals == 3 and got.drafts == 300
    assert got.acceptance_rate == pytest.approx(accepted.sum() / 900)
    assert got.mean_acceptance_length == pytest.approx(1 + accepted.sum() / 300)
    assert got.per_position == pytest.approx([(accepted > p).mean() for p in range(3)])
    counts = np.histogram(ttfts, bins=[0, *TTFT_BUCKETS, np.inf])[0]
    assert got.ttft.p50 == pytest.approx(histogram_quantile(0.5, counts, TTFT_BUCKETS))
    exact = np.quantile(ttfts, 0.5)
    i = int(np.searchsorted(TTFT_BUCKETS, exact))
    assert TTFT_BUCKETS[i - 1] <= got.ttft.p50 <= TTFT_BUCKETS[i]  # in the exact median's bucket
    assert vllm_signals(db, Window(1000, 1100), model="other").intervals == 0


def test_collector_scrapes_a_live_vllm_endpoint(db_url, tmp_path):
    vllm, port = FakeVllm(), free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=vllm.registry)
    url = f"http://127.0.0.1:{port}/metrics"
    settings = Settings(data_dir=tmp_path, database_url=db_url, scrape_vllm=[url], scrape_interval_s=0.05)
    try:
        with TestClient(create_app(settings)) as client:

            def five_drafts() -> dict | None:
                vllm.observe_draft(2)
                body = client.get("/v1/vllm/signals", params={"last": 60, "source": url}).json()
                return body if body["drafts"] >= 5 else None

            body = wait_for(five_drafts, "five scraped drafts", timeout=15, interval=0.05)
            assert body["acceptance_rate"] == pytest.approx(2 / 3)
    finally:
        server.shutdown()
        thread.join(5)


def test_target_gone_and_back_is_one_interval_logged_once(db, caplog):
    """Failed scrapes keep the baseline: the first good scrape after them spans the gap, with the
    counts of the outage (no bogus deltas); the outage is logged once, and its end once."""
    import asyncio

    import httpx

    vllm, port = FakeVllm(), free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    scraper = Scraper(url, db, 15)

    async def scrape() -> list[dict]:
        async with httpx.AsyncClient(timeout=2) as http:
            return await scraper.scrape(http)

    server, thread = start_http_server(port, addr="127.0.0.1", registry=vllm.registry)
    assert asyncio.run(scrape()) == []  # baseline
    server.shutdown()
    server.server_close()
    thread.join(5)
    vllm.observe_draft(3)  # happens while the target cannot be scraped
    with caplog.at_level("WARNING", logger="specwatch.collector"):
        assert asyncio.run(scrape()) == [] and asyncio.run(scrape()) == []
        server, thread = start_http_server(port, addr="127.0.0.1", registry=vllm.registry)
        try:
            [row] = asyncio.run(scrape())
        finally:
            server.shutdown()
            thread.join(5)
    assert (row["drafts"], row["accepted_tokens"], row["counter_reset"]) == (1, 3, False)
    messages = [r.getMessage() for r in caplog.records]
    assert sum("failed" in m for m in messages) == 1 and sum("works again" in m for m in messages) == 1
    assert scraper.down_since is None
