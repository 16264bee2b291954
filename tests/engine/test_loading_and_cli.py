"""Model loading errors, the GGUF cache, accounting on the bundled model, and `specwatch generate`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import DistilBertConfig, DistilBertModel

from specwatch.engine.engine import GenerateRequest
from specwatch.engine.loading import ModelLoadError, bundled_model_path, load_model, resolve_dtype
from specwatch.telemetry.schema import RequestRecord
from tests.engine.conftest import tiny_llama

REPO = Path(__file__).resolve().parents[2]


def test_missing_model_names_the_path(tmp_path):
    with pytest.raises(ModelLoadError, match=str(tmp_path / "nope")):
        load_model(str(tmp_path / "nope"))


def test_a_directory_that_is_not_a_causal_lm_is_a_clear_error(tmp_path):
    DistilBertModel(DistilBertConfig(dim=32, n_layers=1, n_heads=2, hidden_dim=64)).save_pretrained(tmp_path)
    with pytest.raises(ModelLoadError, match="cannot load as a causal language model"):
        load_model(str(tmp_path))
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_model(str(tmp_path / ".."))


def test_a_file_that_is_not_gguf_is_rejected(tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"\0" * 16)
    with pytest.raises(ModelLoadError, match="expected a .gguf file"):
        load_model(str(tmp_path / "weights.bin"))


def test_local_hf_directory_loads(tmp_path, target):
    from tokenizers import Tokenizer, models
    from transformers import PreTrainedTokenizerFast

    tiny_llama(seed=0).save_pretrained(tmp_path)
    vocab = {f"t{i}": i for i in range(256)}
    PreTrainedTokenizerFast(tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t0"))).save_pretrained(
        tmp_path
    )
    loaded = load_model(str(tmp_path), dtype="float32")
    assert loaded.name == tmp_path.name and loaded.dtype == torch.float32
    torch.testing.assert_close(loaded.model.lm_head.weight, target.lm_head.weight)


def test_dtype_choice():
    assert resolve_dtype("float32", torch.device("cpu")) == torch.float32
    assert resolve_dtype("auto", torch.device("cpu")) in (torch.bfloat16, torch.float32)
    with pytest.raises(ModelLoadError, match="unknown dtype"):
        resolve_dtype("int3", torch.device("cpu"))


def test_bundled_model_comes_from_the_cache_after_the_first_load(bundled_engine):
    assert bundled_model_path().name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    again = load_model("bundled", dtype="float32")
    assert again.from_cache and again.cold_start_s < 10
    assert again.model.config.num_hidden_layers == 30 and again.model.config.vocab_size == 49152


@pytest.mark.parametrize("drafter,gamma", [(None, 0), ("ngram", 8), ("early-exit:4", 3)])
def test_accounting_invariants_on_the_bundled_model(bundled_engine, drafter, gamma):
    request = GenerateRequest(
        prompt="one two three four five one two three four five one two",
        max_tokens=30,
        drafter=drafter,
        gamma=gamma,
        tags={"scenario": "test"},
    )
    record = bundled_engine.generate(request).record
    RequestRecord.model_validate(record.model_dump())  # round-trips through the contract's validation
    assert record.num_accepted_tokens <= record.num_draft_tokens
    assert record.accepted_per_position == sorted(record.accepted_per_position, reverse=True)
    assert sum(record.accepted_per_position) == record.num_accepted_tokens
    if record.num_drafts:  # the drafts' own lengths: the adaptive lookahead and max_tokens cut some short
        assert sum(record.drafts_per_position) == record.num_draft_tokens
        assert all(a <= r for a, r in zip(record.accepted_per_position, record.drafts_per_position, strict=True))
    forwards = record.output_tokens - record.num_accepted_tokens
    assert 1 <= forwards <= record.output_tokens and record.num_drafts <= forwards
    assert record.mode == ("speculative" if drafter else "autoregressive") and record.drafter == drafter
    assert 0 < record.ttft_s <= record.e2e_s and record.tags == {"scenario": "test"}


def test_stop_string_cuts_the_text(bundled_engine):
    result = bundled_engine.generate(GenerateRequest(prompt="Count: 1, 2, 3, 4, 5, 6, 7,", max_tokens=40, stop=(" 9",)))
    assert " 9" not in result.text and result.finish_reason == "stop"


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "specwatch", *args], capture_output=True, text=True, env=env, timeout=300
    )


def test_cli_generate_prints_text_and_record(bundled_engine):
    done = run_cli(
        "generate",
        "--prompt",
        "Repeat: red green blue red green blue",
        "--max-tokens",
        "12",
        "--json",
        "--dtype",
        "float32",
    )
    assert done.returncode == 0, done.stderr
    payload = json.loads(done.stdout)
    record = RequestRecord.model_validate(payload["record"])
    assert record.output_tokens <= 12 and record.drafter == "ngram" and payload["text"]


@pytest.mark.parametrize(
    "args,message",
    [
        (["--drafter", "magic"], "unknown drafter"),
        (["--drafter", "auto"], "drafter 'auto' is chosen per request by the server's policy"),
        (["--model", "/does/not/exist"], "model not found: /does/not/exist"),
        (["--temperature", "-2"], "temperature"),
        (["--max-tokens", "0"], "max_tokens"),
        (["--compile", "--dtype", "float16"], "the compiled forwards are the Llama fast path's on a CPU"),
    ],
)
def test_cli_bad_input_exits_2_with_a_message(args, message):
    done = run_cli("generate", "--prompt", "hi", *args)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr


@pytest.mark.parametrize(
    "args,message",
    [
        (["engine", "serve", "--port", "70000"], "not a TCP port"),
        (["engine", "serve", "--slots", "0"], "slots must be >= 1"),
        (["engine", "serve", "--batch-threads", "-1"], "--threads and --batch-threads must be >= 0"),
        (["engine", "serve", "--prefill-chunk", "-1"], "prefill_chunk >= 0"),
        (["engine", "serve", "--load-on", "0.9", "--load-off", "0.5"], "load_on <= load_off"),
        (["engine", "serve", "--memory-high", "0.5", "--memory-low", "0.7"], "memory guard needs 0 < low < high <= 1"),
        (
            ["engine", "serve", "--candidates", "none", "ngram@0"],
            "candidate 'ngram@0': gamma must be an integer in [1, 64]",
        ),
        (["engine", "serve", "--explore", "2"], "explore must be in [0, 1]"),
        (
            ["engine", "serve", "--suffix-requests", "-1"],
            "--suffix-requests: suffix max_requests must be in [0, 100000]",
        ),
        (["engine", "serve", "--shutdown-timeout", "-1"], "--shutdown-timeout must be between 0 and 86400 seconds"),
        (["engine", "serve", "--lookahead", "greedy"], "argument --lookahead: invalid choice: 'greedy'"),
        (["engine", "serve", "--draft-floor", "1"], "--draft-floor: draft floor must be in [0, 1), got 1.0"),
        (["generate", "--prompt", "hi", "--draft-floor", "nan"], "--draft-floor: draft floor must be in [0, 1)"),
        (["traffic", "--scenarios", "poetry"], "unknown scenario 'poetry'"),
        (["traffic", "--concurrency", "0"], "--concurrency"),
        (["traffic", "--url", "http://127.0.0.1:9"], "no engine answering at http://127.0.0.1:9"),
    ],
)
def test_serve_and_traffic_bad_input_exits_2_with_a_message(args, message):
    done = run_cli(*args)
    assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr


def test_an_unknown_cpu_kernel_is_a_usage_error_at_start(monkeypatch):
    monkeypatch.setenv("SPECWATCH_CPU_KERNELS", "row,lanes")
    done = run_cli("generate", "--prompt", "hi", "--max-tokens", "1")
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert "SPECWATCH_CPU_KERNELS: unknown kernel(s) lanes (row, prefill, lane, rows or none)" in done.stderr


def test_cli_lookahead_rule_reaches_the_decoder(bundled_engine):
    """--lookahead fixed asks the drafter for --gamma tokens every round (but the last ones, capped by max tokens)."""
    args = ("generate", "--prompt", "Repeat: red green blue red green blue", "--max-tokens", "24", "--json")
    done = run_cli(*args, "--dtype", "float32", "--gamma", "3", "--lookahead", "fixed")
    assert done.returncode == 0, done.stderr
    record = RequestRecord.model_validate(json.loads(done.stdout)["record"])
    assert record.mean_lookahead is not None and 2.5 <= record.mean_lookahead <= 3.0
