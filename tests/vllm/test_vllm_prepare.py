"""`specwatch vllm prepare`: the converted directory loads with plain transformers and decodes
exactly as the GGUF-loaded model does; a failed conversion is one line and exit code 2.
No vLLM needed; the bundled model's cached float32 copy makes this fast."""

from __future__ import annotations

import json

import pytest

import specwatch.engine.loading  # noqa: F401  (forces offline mode before transformers loads)
from specwatch.cli import main
from specwatch.engine.hf_export import compatible_config, prepare


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    return prepare(tmp_path_factory.mktemp("vllm") / "model")


def test_directory_has_what_vllm_reads(prepared):
    names = {p.name for p in prepared.iterdir()}
    assert {
        "model.safetensors",
        "config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "chat_template.jinja",
    } <= names
    assert not any(name.startswith(".staging") for name in (p.name for p in prepared.parent.iterdir()))
    config = json.loads((prepared / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["vocab_size"] == 49152
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"] and "quantization_config" not in config
    tok_config = json.loads((prepared / "tokenizer_config.json").read_text())
    assert "<|im_start|>assistant" in tok_config["chat_template"]
    assert tok_config["chat_template"] == (prepared / "chat_template.jinja").read_text()


def test_same_greedy_tokens_as_the_gguf_model(prepared):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specwatch.engine.loading import load_model

    reference = load_model("bundled", dtype="float32")
    model = AutoModelForCausalLM.from_pretrained(prepared, dtype=torch.float32, local_files_only=True).eval()
    tokenizer = AutoTokenizer.from_pretrained(prepared, local_files_only=True)
    messages = [{"role": "user", "content": "Repeat exactly: the quick brown fox jumps over the lazy dog"}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)[
        "input_ids"
    ]
    reference_ids = reference.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, return_tensors="pt", return_dict=True
    )["input_ids"]
    assert ids.tolist() == reference_ids.tolist()
    with torch.inference_mode():
        ours = model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False)
        theirs = reference.model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=8, do_sample=False)
    assert ours.tolist() == theirs.tolist()
    assert "quick brown fox" in tokenizer.decode(ours[0, ids.shape[1] :])


def test_compatible_config_spells_rope_both_ways():
    config = compatible_config(
        {
            "rope_parameters": {"rope_theta": 5e5, "rope_type": "default"},
            "dtype": "float32",
            "quantization_config": {"quant_method": "gguf"},
        }
    )
    assert config["rope_theta"] == 5e5 and config["rope_scaling"] is None and config["torch_dtype"] == "float32"
    assert "quantization_config" not in config


def test_bad_model_path_exits_2_with_one_line(tmp_path, capsys):
    assert main(["vllm", "prepare", "--model", str(tmp_path / "missing.gguf"), "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("specwatch vllm: error: conversion failed: model not found") and "\n" not in err
    assert not (tmp_path / "out").exists()


def test_not_a_model_exits_2(tmp_path, capsys):
    bogus = tmp_path / "weights.bin"
    bogus.write_bytes(b"\0" * 16)
    assert main(["vllm", "prepare", "--model", str(bogus), "--out", str(tmp_path / "out")]) == 2
    assert "expected a .gguf file or a model directory" in capsys.readouterr().err


def test_unwritable_output_exits_2(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["vllm", "prepare", "--out", str(blocker / "model")]) == 2
    assert "cannot write here" in capsys.readouterr().err
