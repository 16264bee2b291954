"""`specwatch draft export` (issue 56): a slice of the captures as vLLM `speculators`' conversation JSONL.

The format, from vllm-project/speculators at commit c05b95b303f7d4f21e8d7624e0ffa1c2d9b4d73b (files last
changed in db4246468c2b94e2c0ad8ecef9339a3dc18ef03a):
- scripts/prepare_data.py: `--data PATH` (repeatable) and `--model` (the target model), passed to
  `load_and_preprocess_dataset`;
- src/speculators/data_generation/preprocessing.py: `load_raw_dataset` reads a local `.jsonl` with
  `datasets.load_dataset("json", ...)`, requires a `conversations` column, and `_normalize_conversation`
  reads each turn's `role` (or `from`) and `content` (or `value`), mapping user/human, assistant/gpt,
  system and tool and treating any other role as the assistant's. Extra columns are dropped by its map.
SPECULATORS_LINE is one line in that shape; the export must write lines of the same shape.
"""

from __future__ import annotations

import importlib.util
import time

import httpx
import orjson
import pytest
from thread_server import ThreadServer

from specwatch.cli import main
from specwatch.collector.settings import Settings
from specwatch.service.app import create_app

SPECULATORS_LINE = {
    "conversations": [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "Fix the typo: teh cat"},
        {"role": "assistant", "content": "the cat"},
    ]
}
TARGET = "HuggingFaceTB/SmolLM2-135M-Instruct"


def capture(i: int, kind: str = "chat", **tags: str) -> dict:
    now = time.time()
    return {
        "capture_id": f"req-{i}",
        "instance": "engine-0",
        "model": "smollm2",
        "drafter": "early-exit:4",
        "kind": kind,
        "tags": {"tenant": "acme", "scenario": "chat", **tags},
        "started_at": now - 5,
        "prompt": [{"role": "system", "content": "be brief"}, {"role": "user", "content": f"question {i}"}],
        "output": f"answer {i}",
        "prompt_tokens": 12,
        "output_tokens": 3,
        "num_draft_tokens": 8,
        "num_accepted_tokens": i % 8,
        "expires_at": now + 3600,
    }


@pytest.fixture(scope="module")
def collector(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("export")
    settings = Settings(
        data_dir=tmp, database_url=f"sqlite:///{tmp}/c.db", ingest_token="ing", admin_token="adm", ingest_processes=0
    )
    with ThreadServer(create_app(settings)) as server:
        captures = [capture(i) for i in range(5)] + [capture(5, kind="completion"), capture(6, tenant="globex")]
        stored = httpx.post(
            f"{server.url}/v1/captures",
            content=orjson.dumps({"captures": captures}),
            headers={"content-type": "application/json", "authorization": "Bearer ing"},
        )
        assert stored.json()["stored"] == 7
        yield server.url


def export(url: str, out, *extra: str, token: str = "adm") -> int:
    return main(
        ["draft", "export", "--collector", url, "--out", str(out), "--target-model", TARGET, "--token", token, *extra]
    )


def lines(path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def test_the_export_writes_the_slice_in_speculators_shape(collector, tmp_path, capsys):
    out = tmp_path / "acme.jsonl"
    assert export(collector, out, "--tenant", "acme", "--below-acceptance", "0.4") == 0  # 0..3 of 8 accepted
    rows = lines(out)
    assert [r["id"] for r in rows] == ["req-0", "req-1", "req-2", "req-3"]  # the completion capture left out
    for row in rows:
        assert set(SPECULATORS_LINE) <= set(row) and row["target_model"] == TARGET
        assert all(set(turn) == {"role", "content"} for turn in row["conversations"])
        assert [t["role"] for t in row["conversations"]] == [t["role"] for t in SPECULATORS_LINE["conversations"]]
    assert rows[1]["conversations"][-1]["content"] == "answer 1"
    assert f"--model {TARGET} --data {out}" in capsys.readouterr().err


def test_the_export_needs_an_admin_token_and_a_matching_slice(collector, tmp_path, capsys):
    assert export(collector, tmp_path / "x.jsonl", token="ing") == 2
    assert "refused the export (403)" in capsys.readouterr().err
    assert export(collector, tmp_path / "x.jsonl", "--tenant", "initech") == 2
    assert "no chat captures match" in capsys.readouterr().err and not (tmp_path / "x.jsonl").exists()


SPECULATORS = importlib.util.find_spec("speculators") is not None and importlib.util.find_spec("datasets") is not None


@pytest.mark.skipif(
    not SPECULATORS, reason="speculators (PyPI) and datasets are not installed: pip install speculators"
)
def test_speculators_own_loader_reads_the_export(collector, tmp_path):
    from speculators.data_generation import preprocessing

    out = tmp_path / "acme.jsonl"
    assert export(collector, out, "--tenant", "acme") == 0
    loaded = preprocessing.load_raw_dataset(str(out))
    dataset = loaded[0] if isinstance(loaded, tuple) else loaded
    assert "conversations" in dataset.column_names and len(dataset) == 5
    for row in dataset:
        turns = preprocessing._normalize_conversation(row["conversations"])
        assert [t["role"] for t in turns] == ["system", "user", "assistant"] and turns[-1]["content"].startswith(
            "answer"
        )


def test_draft_train_refuses_bad_input_before_loading_a_model(tmp_path, capsys):
    assert main(["draft", "train", "--data", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "d")]) == 2
    assert "no export file" in capsys.readouterr().err
    (tmp_path / "x.jsonl").write_text("{}\n")
    argv = ["draft", "train", "--data", str(tmp_path / "x.jsonl"), "--out", str(tmp_path / "d")]
    assert main([*argv, "--kind", "exit", "--train-layers", "9"]) == 2
    assert "train_layers must be in [1, layers=6]" in capsys.readouterr().err
    assert main([*argv, "--depth", "0"]) == 2 and "must be positive" in capsys.readouterr().err
    assert main([*argv, "--draft-vocab", "0"]) == 2 and "exit only" in capsys.readouterr().err
    assert main([*argv, "--kind", "exit", "--init", str(tmp_path)]) == 2 and "--kind head" in capsys.readouterr().err
    argv[3:4] = [str(tmp_path / "x.jsonl"), str(tmp_path / "gone.jsonl")]  # two files, the second missing
    assert main(argv) == 2 and "no export file" in capsys.readouterr().err
