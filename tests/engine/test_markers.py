"""Deploy markers from the engine: the identity a `config` event carries (version, model hash, drafters),
and the control API's mode/default-drafter change emitting one (an alert's fallback does not)."""

from __future__ import annotations

import os

import httpx
import pytest
from engine_harness import BackgroundServer

from specwatch.engine.markers import identity, model_hash, specwatch_version
from specwatch.engine.policy import PolicyConfig
from specwatch.engine.scheduler import SchedulerConfig
from specwatch.telemetry.schema import EngineEvent

TOKEN = {"authorization": "Bearer s3cret"}


def test_model_hash_follows_the_files_not_their_contents(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(b"x" * 10)
    first = model_hash(tmp_path)
    assert model_hash(tmp_path) == first and len(first) == 16
    (tmp_path / "notes.txt").write_text("not a model file")
    assert model_hash(tmp_path) == first
    weights.write_bytes(b"y" * 11)  # a new checkpoint: another size
    assert model_hash(tmp_path) != first
    os.utime(weights, ns=(0, 0))  # same size, other mtime
    assert model_hash(tmp_path) not in (first, model_hash(tmp_path.parent))


def test_identity_names_version_model_and_drafters(bundled_engine):
    found = identity(bundled_engine, "big", {"big": "model:bundled"})
    assert found["version"] == specwatch_version() and found["version"] != ""
    assert found["model"] == bundled_engine.target.name and found["model_hash"] == model_hash(
        bundled_engine.target.path
    )
    assert (found["drafter"], found["default_drafter"], found["drafters"]) == (
        "model:bundled",
        "big",
        {"big": "model:bundled"},
    )
    assert identity(bundled_engine, "none", {})["drafter"] == "none"


def test_control_api_changes_emit_a_config_marker(bundled_engine):
    events = []
    with BackgroundServer(bundled_engine, SchedulerConfig(slots=1), PolicyConfig(), control_token="s3cret") as server:
        server.sink.subscribe(EngineEvent, lambda e: events.append((e.kind, e.detail)))
        post = lambda body: httpx.post(f"{server.url}/v1/control/mode", json=body, headers=TOKEN)  # noqa: E731
        assert post({"mode": "auto", "drafter": "early-exit:4"}).status_code == 200
        server.client().completions.create(model=None, prompt="Hi", max_tokens=4, temperature=0)
        assert server.records[-1].drafter == "early-exit:4"  # the new default for requests naming none
        assert post({"mode": "autoregressive", "reason": "alert"}).status_code == 200  # remediation: no marker
        assert post({"mode": "auto", "drafter": "early-exit:99"}).status_code == 400
        assert post({"mode": "auto", "drafter": "/etc/passwd"}).status_code == 400
    configs = [d for kind, d in events if kind == "config"]
    assert len(configs) == 1
    assert (configs[0]["drafter"], configs[0]["mode"], configs[0]["model"]) == (
        "early-exit:4",
        "auto",
        bundled_engine.target.name,
    )


@pytest.mark.parametrize("body", [{"mode": "auto", "drafter": "x" * 300}])
def test_oversized_drafter_is_refused(bundled_engine, body):
    with BackgroundServer(bundled_engine, SchedulerConfig(slots=1), PolicyConfig(), control_token="s3cret") as server:
        assert httpx.post(f"{server.url}/v1/control/mode", json=body, headers=TOKEN).status_code == 400
