"""Request validation on the engine API (bundled model, real HTTP): every refusal is a 400 in OpenAI's
error shape naming the field; prompts must fit the context; drafters come from the server's own list;
the control API is off without a token; an incoming x-request-id (a gateway's) becomes the record's id."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import torch
from engine_harness import BackgroundServer
from safetensors.torch import save_file
from waiting import wait_for

import specwatch.engine.engine as engine_module
from specwatch.engine.cli import register_drafters
from specwatch.engine.draft_vocab import FILE as VOCAB_FILE
from specwatch.engine.draft_vocab import save_vocabulary
from specwatch.engine.lookahead import CostCurve
from specwatch.engine.policy import PolicyConfig
from specwatch.engine.scheduler import SchedulerConfig
from specwatch.telemetry.schema import RequestRecord
from tests.engine.conftest import tiny_llama

SOURCE_ROOT = Path(__file__).resolve().parents[2]  # the repository

TOKEN = "s3cret"


def Server(engine, **app_options) -> BackgroundServer:
    return BackgroundServer(engine, SchedulerConfig(slots=2, max_queue=8), PolicyConfig(), **app_options)


@pytest.fixture(scope="module")
def server(bundled_engine):
    with Server(bundled_engine, control_token=TOKEN) as running:
        yield running


def complete(server, **body) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/completions", json={"prompt": "Hi", "max_tokens": 2, **body}, timeout=60)


def chat(server, **body) -> httpx.Response:
    messages = [{"role": "user", "content": "Hi"}]
    return httpx.post(f"{server.url}/v1/chat/completions", json={"messages": messages, "max_tokens": 2, **body})


def refused(response: httpx.Response, param: str, code: str | None = None) -> dict:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == param and error["message"], error
    assert code is None or error["code"] == code, error
    return error


@pytest.mark.parametrize(
    "field,value",
    [
        ("seed", 2**80),
        ("seed", -(2**64)),
        ("seed", 1.5),
        ("gamma", 65),
        ("gamma", -1),
        ("gamma", "many"),
        ("temperature", 2.5),
        ("temperature", -0.1),
        ("temperature", "hot"),
        ("top_p", 0),
        ("top_p", 1.5),
        ("top_k", -2),
        ("max_tokens", 0),
        ("max_tokens", 10**6),
        ("n", 2),
        ("stop", ["a", "b", "c", "d", "e"]),
        ("stop", 7),
        ("prompt", 5),
        ("prompt", [1, 2, 3]),
        ("prompt", ["a", "b"]),
        ("prompt", ""),
        ("drafter", "magic"),
        ("drafter", "model:/etc/passwd"),
        ("drafter", "early-exit:99"),
        ("drafter", "early-exit:0"),
        ("drafter", "x" * 10_000),
        ("tags", {"scenario": "x" * 1000}),
        ("tags", {"scenario": "nul\x00"}),  # the telemetry contract refuses NUL (PostgreSQL text cannot hold it)
        ("tags", {"": "empty key"}),
        # issue 30 #8: strict types (the gateway refuses these too), unsupported parameters named
        ("stream", "yes"),
        ("stream", 1),
        ("max_tokens", "20"),
        ("max_tokens", True),
        ("seed", "7"),
        ("temperature", "0.5"),
        ("logprobs", 2),
        ("top_logprobs", 1),
    ],
)
def test_a_bad_field_is_a_400_naming_it(server, field, value):
    refused(complete(server, **{field: value}), field)


@pytest.mark.parametrize(
    "body,param",
    [
        ({"messages": []}, "messages"),
        ({"messages": [{"role": "user", "content": 3}]}, "messages"),
        ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"max_completion_tokens": 0}, "max_completion_tokens"),
        ({"seed": 2**80}, "seed"),
        ({"logprobs": True}, "logprobs"),
        ({"stream": "yes"}, "stream"),
    ],
)
def test_a_bad_chat_field_is_a_400_naming_it(server, body, param):
    refused(chat(server, **body), param)


def test_invalid_json_names_no_parameter(server):
    """Issue 30 #8: the error's param was the character offset ("14")."""
    for path in ("completions", "chat/completions"):
        response = httpx.post(
            f"{server.url}/v1/{path}", content=b'{"prompt": "Hi",', headers={"content-type": "application/json"}
        )
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["param"] is None and error["code"] == "json_invalid" and "not valid JSON" in error["message"]


def test_the_edges_of_the_ranges_are_served(server):
    for body in ({"seed": 2**64 - 1, "temperature": 0.7}, {"seed": -(2**63)}, {"top_k": -1}, {"temperature": 1e-300}):
        assert complete(server, **body).status_code == 200, body
    assert complete(server, stop=["a", "b", "c", "d"], gamma=0, top_k=5).status_code == 200
    assert complete(server, temperature=1, logprobs=None, top_logprobs=None).status_code == 200  # an int is a number
    assert chat(server, logprobs=False).status_code == 200


def test_a_prompt_longer_than_the_context_is_context_length_exceeded(server, bundled_engine):
    assert bundled_engine.context_tokens == 8192
    refused(complete(server, prompt="x" * 100_000), "prompt", "context_length_exceeded")
    error = refused(complete(server, prompt="x" * 10_000_000), "prompt", "context_length_exceeded")
    assert "10000000 characters" in error["message"]  # refused before tokenising
    long_chat = [{"role": "user", "content": "word " * 20_000}]
    refused(chat(server, messages=long_chat), "messages", "context_length_exceeded")
    # under the character pre-check, over the context once tokenised (two tokens per 'hello world ')
    error = refused(complete(server, prompt="hello world " * 4200), "prompt", "context_length_exceeded")
    assert "tokens" in error["message"] and "8192" in error["message"]
    # the prompt must leave room for max_tokens
    refused(complete(server, prompt="hello world " * 50, max_tokens=8100), "prompt", "context_length_exceeded")
    refused(complete(server, max_tokens=8192), "prompt", "context_length_exceeded")


def test_max_prompt_tokens_caps_the_prompt(server, bundled_engine, monkeypatch):
    monkeypatch.setattr(bundled_engine, "config", dataclasses.replace(bundled_engine.config, max_prompt_tokens=20))
    error = refused(complete(server, prompt="one two three four five six " * 5), "prompt", "context_length_exceeded")
    assert "--max-prompt-tokens 20" in error["message"]
    assert complete(server, prompt="one two three").status_code == 200


@pytest.fixture
def tripwire(tmp_path, monkeypatch):
    """A real file that must not be looked at: every stat, open or model load of it is recorded."""
    trap = tmp_path / "trap.gguf"
    trap.write_bytes(b"GGUF but not really")
    touched: list[str] = []
    real_stat, real_load = os.stat, engine_module.load_model

    def stat(path, *args, **kwargs):
        if str(trap) in os.fsdecode(path) if isinstance(path, (str, bytes, os.PathLike)) else False:
            touched.append("stat")
        return real_stat(path, *args, **kwargs)

    def load_model(source, *args, **kwargs):
        touched.append(f"load_model {source}")
        return real_load(source, *args, **kwargs)

    def audit(event: str, args: tuple) -> None:
        if event in ("open", "os.listdir", "os.scandir") and args and str(trap) in str(args[0]):
            touched.append(event)

    monkeypatch.setattr(os, "stat", stat)
    monkeypatch.setattr(engine_module, "load_model", load_model)
    _AUDITS.append(audit)
    yield trap, touched
    _AUDITS.remove(audit)


_AUDITS: list = []
sys.addaudithook(lambda event, args: [hook(event, args) for hook in list(_AUDITS)])


def test_a_model_path_from_a_request_is_refused_without_touching_the_file(server, tripwire):
    trap, touched = tripwire
    os.stat(trap)  # the tripwire works
    assert touched == ["stat"]
    touched.clear()
    for drafter in (f"model:{trap}", "model:/etc/passwd", "model:/etc", "model:bundled", str(trap)):
        error = refused(complete(server, drafter=drafter, gamma=2), "drafter")
        assert "use one of none, ngram, suffix, early-exit:K, auto" in error["message"]
        refused(chat(server, drafter=drafter), "drafter")
    assert touched == []


@pytest.fixture(scope="module")
def tiny_draft_dir(bundled_engine, tmp_path_factory):
    """A randomly initialised 2-layer Llama sharing the bundled model's tokenizer, saved as an HF directory."""
    path = tmp_path_factory.mktemp("tiny-draft")
    vocab = bundled_engine.target.model.get_output_embeddings().weight.shape[0]
    tiny_llama(seed=3, vocab=vocab, layers=2).save_pretrained(path)
    bundled_engine.tokenizer.save_pretrained(path)
    return path


@pytest.fixture
def restore_drafters(bundled_engine):
    """Registering a drafter loads it into the shared engine: forget it afterwards (other tests count drafters)."""
    slot_drafters, draft_models = dict(bundled_engine.default_slot.drafters), dict(bundled_engine._draft_models)
    yield
    bundled_engine.default_slot.drafters = slot_drafters
    bundled_engine._draft_models = draft_models


def test_a_registered_drafter_is_chosen_by_name(bundled_engine, tiny_draft_dir, restore_drafters, monkeypatch):
    # a fresh step-cost curve, as a new engine has: the cost lookahead then drafts to measure, where the
    # shared engine's curve, filled by earlier tests, may already say drafting does not pay at 4 tokens
    monkeypatch.setattr(bundled_engine, "step_costs", CostCurve())
    drafters = register_drafters(bundled_engine, [f"tiny=model:{tiny_draft_dir}"])
    assert drafters == {"tiny": f"model:{tiny_draft_dir}"}
    with Server(bundled_engine, drafters=drafters) as running:
        answer = complete(running, prompt="Once upon a time", drafter="tiny", gamma=2, max_tokens=4)
        assert answer.status_code == 200, answer.text
        refused(complete(running, drafter="small"), "drafter")
        assert "tiny" in refused(complete(running, drafter=f"model:{tiny_draft_dir}"), "drafter")["message"]
    record = next(record for record in running.records if record.status == "ok")  # the refusals have theirs
    assert (record.drafter, record.mode) == (f"model:{tiny_draft_dir.name}", "speculative")
    assert record.num_drafts >= 1


def test_a_registered_draft_with_a_reduced_vocabulary_serves_through_its_map(
    bundled_engine, tiny_draft_dir, tmp_path, restore_drafters
):
    vocab = bundled_engine.target.model.get_output_embeddings().weight.shape[0]
    reduced, bad = tmp_path / "reduced", tmp_path / "bad"
    for path in (reduced, bad):
        shutil.copytree(tiny_draft_dir, path)
    save_vocabulary(reduced, torch.tensor([2, 5, 9]), vocab)
    register_drafters(bundled_engine, [f"reduced=model:{reduced}"])
    drafter = bundled_engine.drafter(f"model:{reduced}")
    assert drafter.to_target == [2, 5, 9] and drafter.decoder.vocab_size == 3
    save_file({"d2t": torch.tensor([0, 0]), "t2d": torch.ones(vocab, dtype=torch.bool)}, str(bad / VOCAB_FILE))
    with pytest.raises(ValueError, match="d2t and t2d name different tokens"):
        register_drafters(bundled_engine, [f"bad=model:{bad}"])


@pytest.mark.parametrize(
    "item,message",
    [
        ("tiny", "expected NAME=model:PATH"),
        ("ngram=model:bundled", "built-in drafter"),
        ("a/b=model:bundled", "expected NAME=model:PATH"),
        ("x=model:/does/not/exist", "draft model not found"),
    ],
)
def test_bad_drafter_registrations_are_refused(bundled_engine, item, message, restore_drafters):
    with pytest.raises(ValueError, match=message):
        register_drafters(bundled_engine, [item])


def test_serve_refuses_bad_drafters_and_max_prompt_tokens_with_exit_2():
    env = {**os.environ, "PYTHONPATH": str(SOURCE_ROOT)}
    for args, message in (
        (["--max-prompt-tokens", "0"], "not a positive integer"),
        (["--drafters", "x=model:/does/not/exist", "--dtype", "float32"], "draft model not found"),
    ):
        command = [sys.executable, "-m", "specwatch", "engine", "serve", "--port", "1", *args]
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=300)
        assert done.returncode == 2 and message in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_the_control_api_is_off_without_a_token(bundled_engine):
    with Server(bundled_engine) as open_engine:
        for method, path in (("POST", "mode"), ("GET", "state"), ("POST", "defragment")):
            answer = httpx.request(method, f"{open_engine.url}/v1/control/{path}", json={"mode": "autoregressive"})
            assert answer.status_code == 403 and "--control-token" in answer.json()["error"]["message"]
            assert answer.json()["error"]["type"] == "permission_error"
        assert open_engine.scheduler.policy.state["override"] == "auto"


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER"])
def test_the_bearer_scheme_is_case_insensitive(server, scheme):
    answer = httpx.get(f"{server.url}/v1/control/state", headers={"authorization": f"{scheme} {TOKEN}"})
    assert answer.status_code == 200 and "load" in answer.json()


@pytest.mark.parametrize("header", [None, "Bearer nope", f"Basic {TOKEN}", f"Bearer {TOKEN}x", "Bearer"])
def test_a_missing_or_wrong_token_is_401(server, header):
    headers = {"authorization": header} if header else {}
    answer = httpx.post(f"{server.url}/v1/control/mode", json={"mode": "autoregressive"}, headers=headers)
    assert answer.status_code == 401 and answer.json()["error"]["type"] == "authentication_error"
    assert answer.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize(
    "headers,param",
    [
        ({"x-request-id": "x" * 129}, "x-request-id"),  # over the telemetry contract's 128
        ({"x-request-id": "two words"}, "x-request-id"),
        ({"x-request-id": "tab\there"}, "x-request-id"),
        ({"x-request-id": ""}, "x-request-id"),
        ({"x-request-id": "ok", "x-specwatch-started-at": "yesterday"}, "x-specwatch-started-at"),
        ({"x-request-id": "ok", "x-specwatch-started-at": "nan"}, "x-specwatch-started-at"),
    ],
)
def test_a_bad_request_id_header_is_a_400_naming_it(server, headers, param):
    body = {"prompt": "Hi", "max_tokens": 2}
    refused(httpx.post(f"{server.url}/v1/completions", json=body, headers=headers, timeout=60), param)


def test_the_record_adopts_the_incoming_request_id_and_started_at(server):
    def served(headers: dict) -> RequestRecord:
        before = len(server.records)
        body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
        answer = httpx.post(f"{server.url}/v1/chat/completions", json=body, headers=headers, timeout=60)
        assert answer.status_code == 200, answer.text
        return wait_for(lambda: server.records[before:] and server.records[-1], "the request's record")

    arrived = time.time() - 0.25  # a gateway's clock, a little earlier
    record = served({"x-request-id": "gw-0123456789abcdef", "x-specwatch-started-at": repr(arrived)})
    assert (record.request_id, record.started_at) == ("gw-0123456789abcdef", arrived)
    record = served({"x-request-id": "client-key-7"})  # an id alone: the engine's own clock
    assert record.request_id == "client-key-7" and abs(record.started_at - time.time()) < 60
    skewed = served({"x-request-id": "skewed-1", "x-specwatch-started-at": repr(time.time() - 3600)})
    assert skewed.request_id == "skewed-1" and abs(skewed.started_at - time.time()) < 60  # over 300 s off: not taken
    fresh = served({"x-specwatch-started-at": repr(arrived)})  # no id: neither is adopted
    assert len(fresh.request_id) == 32 and fresh.started_at != arrived
