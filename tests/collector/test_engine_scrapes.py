"""SGLang's, llama.cpp's and TensorRT-LLM's /metrics through the one scraper: counters used, gauges and
`_created` never summed, acceptance normalised to the same definitions as vLLM's (collector.ingest.
sglang_metrics, llamacpp_metrics, trtllm_metrics). Fixtures: tests/collector/fixtures/{engine}_metrics_*.txt,
each naming the engine source file and commit it was built from."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from specwatch.collector.ingest.vllm import Scraper, parse, vllm_signals
from specwatch.collector.reads.queries import Window

FIXTURES = Path(__file__).parent / "fixtures"


def scrape_pair(db, engine: str) -> dict:
    scraper = Scraper(f"http://{engine}:8000/metrics", db, 15)
    assert scraper.observe((FIXTURES / f"{engine}_metrics_1.txt").read_text(), at=1000.0) == []
    [row] = scraper.observe((FIXTURES / f"{engine}_metrics_2.txt").read_text(), at=1015.0)
    return row


def test_sglang_counters_sum_label_values_and_skip_gauges_and_created():
    snap = parse((FIXTURES / "sglang_metrics_1.txt").read_text())[("Qwen/Qwen3-8B", "")]
    # generation tokens: is_streaming false + true; the _created series (1.765e9) never enter a sum
    assert snap.counters == {"generation_tokens": 400.0, "drafts": 150.0, "requests": 6.0}
    assert snap.buckets["ttft"] == {0.1: 4.0, float("inf"): 6.0}
    assert snap.speculating


def test_sglang_scrape_derives_accepted_tokens(db):
    row = scrape_pair(db, "sglang")
    # generated 1100, verify calls 450, requests 9: accepted = 1100 - 450 - 9 (one prefill token each)
    assert (row["drafts"], row["generation_tokens"], row["accepted_tokens"]) == (450, 1100, 641)
    assert row["draft_tokens"] == 0  # SGLang counts no drafted tokens: acceptance rate stays unknown
    assert not row["counter_reset"] and row["accepted_per_position"] == []


def test_sglang_gauges_do_not_move_the_row(db):
    """The two scrapes' spec_accept_length / spec_accept_rate gauges differ (3.5 -> 1.2, 0.9 -> 0.05);
    the row is the counters' alone, the same with the gauges removed."""
    without = FIXTURES / "sglang_metrics_2.txt"
    text = "\n".join(line for line in without.read_text().splitlines() if "spec_accept" not in line) + "\n"
    scraper = Scraper("http://sglang:8000/metrics", db, 15)
    scraper.observe((FIXTURES / "sglang_metrics_1.txt").read_text(), at=1000.0)
    [row] = scraper.observe(text, at=1015.0)
    assert (row["drafts"], row["accepted_tokens"]) == (450, 641)


def test_sglang_impossible_accepted_is_clamped_and_logged(db, caplog):
    broken = (FIXTURES / "sglang_metrics_2.txt").read_text().replace("} 1000\n", "} 300\n", 1)
    scraper = Scraper("http://sglang:8000/metrics", db, 15)
    scraper.observe((FIXTURES / "sglang_metrics_1.txt").read_text(), at=1000.0)
    [row] = scraper.observe(broken, at=1015.0)
    assert row["accepted_tokens"] == 0 and "accepted clamped to 0" in caplog.text


def test_sglang_scrape_lands_with_normalised_acceptance(db):
    scrape_pair(db, "sglang")
    signals = vllm_signals(db, Window(999.0, 1016.0), source="http://sglang:8000/metrics")
    assert signals.mean_acceptance_length == pytest.approx(1 + 641 / 450)
    assert signals.acceptance_rate is None  # no drafted-token counter: unknown, not 0
    assert signals.drafted_step_fraction == pytest.approx(450 / (1100 - 641))
    assert signals.speculating


def test_llamacpp_scrape_reads_vllm_schema(db):
    row = scrape_pair(db, "llamacpp")
    # 3.05406e+06 and 1.2e+06: C++ default formatting parsed as numbers
    assert (row["drafts"], row["draft_tokens"], row["accepted_tokens"]) == (2900, 8700, 5220)
    assert row["generation_tokens"] == 1.2e6 - 400
    assert row["accepted_per_position"] == [2320, 1740, 1160]


def test_llamacpp_scrape_lands_with_normalised_acceptance(db):
    scrape_pair(db, "llamacpp")
    signals = vllm_signals(db, Window(999.0, 1016.0), source="http://llamacpp:8000/metrics")
    assert signals.acceptance_rate == pytest.approx(5220 / 8700)
    assert signals.mean_acceptance_length == pytest.approx(1 + 5220 / 2900)
    assert signals.conditional_acceptance == pytest.approx(2320 / 2900)
    assert signals.per_position == pytest.approx([2320 / 2900, 1740 / 2900, 1160 / 2900])


def test_llamacpp_without_drafts_is_not_speculating():
    text = (FIXTURES / "llamacpp_metrics_1.txt").read_text()
    idle = text.replace("spec_decode_num_drafts_total 100", "spec_decode_num_drafts_total 0")
    idle = "\n".join(line for line in idle.splitlines() if "per_pos" not in line) + "\n"
    assert not parse(idle)[("", "")].speculating
    assert parse(text)[("", "")].speculating


def test_trtllm_scrape_reads_per_position_counters(db):
    row = scrape_pair(db, "trtllm")
    # drafted per position [300, 300, 240]: drafts = position 0, draft tokens = the sum; the iteration-level
    # num_draft_tokens / num_accepted_tokens counters (99999, 88888) and the acceptance gauge are not read
    assert (row["drafts"], row["draft_tokens"], row["accepted_tokens"]) == (300, 840, 420)
    assert row["accepted_per_position"] == [210, 140, 70] and row["generation_tokens"] == 1600


def test_trtllm_scrape_lands_with_normalised_acceptance(db):
    scrape_pair(db, "trtllm")
    signals = vllm_signals(db, Window(999.0, 1016.0), source="http://trtllm:8000/metrics")
    assert signals.acceptance_rate == pytest.approx(420 / 840)
    assert signals.mean_acceptance_length == pytest.approx(1 + 420 / 300)
    assert signals.conditional_acceptance == pytest.approx(210 / 300)
    assert signals.acceptance_length_ratio == pytest.approx((1 + 420 / 300) / 4)
    assert signals.speculating


def test_llamacpp_counters_named_without_total_read_the_same():
    """PR #26389 (ggml-org/llama.cpp) lists the counters without `_total`; either spelling is read."""
    text = (FIXTURES / "llamacpp_metrics_2.txt").read_text().replace("_total", "")
    snap = parse(text)[("", "")]
    assert snap.counters == {"generation_tokens": 1.2e6, "draft_tokens": 9000, "accepted_tokens": 5400, "drafts": 3000}
    assert snap.per_position == {0: 2400, 1: 1800, 2: 1200}


def test_every_engine_through_the_signals_api(db, client):
    """One store, four engines scraped, each read back over `GET /v1/vllm/signals` in the same definitions."""
    now = time.time()
    for engine in ("sglang", "llamacpp", "trtllm"):
        scraper = Scraper(f"http://{engine}:8000/metrics", db, 15)
        scraper.observe((FIXTURES / f"{engine}_metrics_1.txt").read_text(), at=now - 30)
        scraper.observe((FIXTURES / f"{engine}_metrics_2.txt").read_text(), at=now - 15)

    def read(engine: str) -> dict:
        params = {"last": 120, "source": f"http://{engine}:8000/metrics"}
        return client.get("/v1/vllm/signals", params=params).json()

    assert read("sglang")["acceptance_rate"] is None
    assert read("sglang")["mean_acceptance_length"] == pytest.approx(1 + 641 / 450)
    assert read("llamacpp")["acceptance_rate"] == pytest.approx(5220 / 8700)
    assert read("trtllm")["conditional_acceptance"] == pytest.approx(210 / 300)
    assert all(read(engine)["speculating"] for engine in ("sglang", "llamacpp", "trtllm"))


def test_a_series_appearing_later_is_no_counter_reset(db):
    """SGLang creates `is_streaming="true"` children on the first streamed request: with their own `_created`,
    they must not read as a restart of the series already there."""
    first = "\n".join(
        line
        for line in (FIXTURES / "sglang_metrics_1.txt").read_text().splitlines()
        if 'is_streaming="true"' not in line
    )
    scraper = Scraper("http://sglang:8000/metrics", db, 15)
    scraper.observe(first + "\n", at=1000.0)
    second = (FIXTURES / "sglang_metrics_2.txt").read_text()
    later = 'sglang:generation_tokens_created{model_name="Qwen/Qwen3-8B",is_streaming="true"} 1.7650e+09'
    assert later in second
    [row] = scraper.observe(second.replace(later, later.replace("1.7650e+09", "1.7650009e+09")), at=1015.0)
    assert not row["counter_reset"]
    assert (row["drafts"], row["generation_tokens"]) == (450, 1500 - 300)
