"""TensorRT-LLM's per-request perf metrics (collector.ingest.trtllm_perf) and `specwatch ingest trtllm-perf`.

The fixture (tests/collector/fixtures/trtllm_perf_metrics.jsonl) has the shape `GET /perf_metrics` answers
in NVIDIA/TensorRT-LLM tensorrt_llm/serve/openai_server.py (`get_perf_metrics`) at commit
00057725d9a6591f033e44f31c219e2426827bb7: line 1 one whole answer (a JSON array: a request that drafted,
one that did not, so it has no `speculative_decoding`), line 2 one record whose counts are impossible
(36 accepted of 30 drafted; its first token before its scheduling). Values made up.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from collector_live import running_collector

from specwatch.cli import main
from specwatch.collector.ingest.trtllm_perf import BadLine, Source, read_records
from specwatch.collector.reads.queries import Filters, Window, signals
from specwatch.common.procs import free_port
from specwatch.telemetry.clamps import CLAMPED_TAG

FIXTURE = Path(__file__).parent / "fixtures" / "trtllm_perf_metrics.jsonl"
OFFSET = time.time() - 18_100.0  # epoch s - the fixture's steady clock: the requests ran ~100 s ago


def records(drafter="eagle3", offset=OFFSET, written_at=0.0):
    source = Source("trt-0", "meta-llama/Llama-3.1-8B-Instruct", drafter, offset)
    return read_records(FIXTURE.read_text().splitlines(), source, written_at)


def test_perf_metrics_become_records_with_acceptance():
    spec, plain, impossible = records()
    assert (spec.num_draft_tokens, spec.num_accepted_tokens) == (120, 66)
    assert spec.acceptance_rate == pytest.approx(0.55)  # the same as TensorRT-LLM's own figure
    assert spec.tags["trtllm_acceptance_rate"] == "0.55"
    # 40 generation iterations after the context one: 40 verify steps, 1 + 40 + 66 tokens (estimates)
    assert (spec.num_drafts, spec.output_tokens, spec.tags["counts"]) == (40, 107, "estimate:iterations")
    assert spec.started_at == pytest.approx(18001.25 + OFFSET)
    assert (spec.queue_s, spec.ttft_s, spec.e2e_s) == pytest.approx((0.02, 0.15, 1.85))
    assert spec.tags["prompt_tokens"] == "unknown" and spec.prompt_tokens == 0
    assert (plain.num_drafts, plain.num_draft_tokens, plain.mode) == (0, 0, "speculative")  # drafted nothing
    assert CLAMPED_TAG not in spec.tags and "clock" not in spec.tags


def test_impossible_values_are_clamped_and_flagged():
    impossible = records()[2]
    assert (impossible.num_draft_tokens, impossible.num_accepted_tokens) == (30, 30)
    assert impossible.tags[CLAMPED_TAG] == "over_drafted:36"
    assert impossible.tags["times_clamped"] == "out_of_order" and impossible.ttft_s == pytest.approx(0.01)


def test_without_an_offset_the_clock_is_estimated_from_the_file_time():
    written = time.time()
    spec = records(offset=None, written_at=written)[0]
    assert spec.started_at == pytest.approx(written - (18003.10 - 18001.25))  # request 3 finished last
    assert spec.tags["clock"] == "estimate:file_mtime"


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", "line 3: not JSON"),
        ('{"request_id": 9}', "line 3: not a perf-metrics record: no field 'perf_metrics'"),
        (
            '{"request_id": 9, "perf_metrics": {"first_iter": 1.5, "last_iter": 2, "timing_metrics": '
            '{"arrival_time": 1, "first_scheduled_time": 1, "first_token_time": 1, "last_token_time": 1}}}',
            "line 3: not a perf-metrics record: 1.5 is no integer count",
        ),  # fmt: skip
        ('"a string"', "line 3: not a perf-metrics record: record must be a JSON object"),
        (
            '{"request_id": 9, "perf_metrics": []}',
            "line 3: not a perf-metrics record: perf_metrics must be a JSON object",
        ),
    ],
)
def test_a_bad_line_is_named(line, message):
    source = Source("trt-0", "m", "eagle3", OFFSET)
    with pytest.raises(BadLine, match=message):
        read_records([*FIXTURE.read_text().splitlines(), line], source, 0.0)


def test_drafting_without_a_drafter_is_refused():
    with pytest.raises(BadLine, match="line 1: the request drafted: pass --drafter"):
        records(drafter=None)


def ingest(url: str, path: Path, *extra: str) -> int:
    return main(["ingest", "trtllm-perf", str(path), "--collector", url, "--instance", "trt-0",
                 "--model", "meta-llama/Llama-3.1-8B-Instruct", "--drafter", "eagle3", *extra])  # fmt: skip


def test_cli_sends_the_file_and_the_records_land_normalised(settings, db, capsys):
    with running_collector(settings, free_port()) as url:
        assert ingest(url, FIXTURE, "--clock-offset", str(OFFSET)) == 0
        assert "3 records from" in capsys.readouterr().out
        assert ingest(url, FIXTURE, "--clock-offset", str(OFFSET)) == 0  # again: idempotent
        assert "0 stored, 3 already there" in capsys.readouterr().out
    read = signals(db, Window(OFFSET + 18_000, time.time()), Filters(instance="trt-0"))
    assert read.acceptance_rate == pytest.approx((66 + 30) / (120 + 30))
    assert read.mean_acceptance_length == pytest.approx(1 + (66 + 30) / (40 + 10))


def test_cli_bad_line_sends_nothing(settings, db, tmp_path, capsys):
    bad = tmp_path / "perf.jsonl"
    bad.write_text(FIXTURE.read_text() + '{"request_id": 1}\n')
    with running_collector(settings, free_port()) as url:
        assert ingest(url, bad, "--clock-offset", str(OFFSET)) == 2
    assert "line 3: not a perf-metrics record: no field 'perf_metrics'; nothing was sent" in capsys.readouterr().err
    assert signals(db, Window(OFFSET + 18_000, time.time()), Filters(instance="trt-0")).requests == 0


def test_cli_refuses_an_unknown_drafter(capsys):
    assert main(["ingest", "trtllm-perf", str(FIXTURE), "--collector", "http://127.0.0.1:9", "--instance", "t",
                 "--model", "m", "--drafter", "Eagle3"]) == 2  # fmt: skip
    assert "--drafter 'Eagle3' is none of ngram, suffix, eagle, eagle3" in capsys.readouterr().err
