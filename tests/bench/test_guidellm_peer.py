"""Issue 57: GuideLLM 0.8.1 (vLLM's benchmark client) as a real peer of the engine and the gateway, chat and
completions, synchronous and concurrent streams (bench/guidellm_peer.py, short benchmarks): no request fails,
the store holds exactly the requests the client completed or cut, and no completed stream is stored as
cancelled. The timing goals (TTFT within 20 ms, tokens/s within 5%) are the bench's table, measured on a
quiet machine with its default 60 s benchmarks (docs/benchmarks.md)."""

from __future__ import annotations

import json

import pytest

from bench import guidellm_peer

pytestmark = pytest.mark.slow


def test_guidellm_sees_what_the_store_records(tmp_path):
    if reason := guidellm_peer.missing():
        pytest.skip(reason)
    out = tmp_path / "peer.json"
    assert guidellm_peer.main(["--seconds", "8", "--streams", "2,4", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert {(row["target"], row["format"]) for row in rows} == {
        (target, name) for target in ("engine", "gateway") for name in ("chat", "completions")
    }
    for row in rows:
        assert row["errors"] == row["stored_errors"] == 0, row
        assert row["completed"] + row["incomplete"] > 0, row
        assert row["stored"] == row["completed"] + row["incomplete"], row
        assert row["stored_cancelled"] <= row["incomplete"], row
        assert row["joined"] == row["completed"], row  # each completed request found by its response id
