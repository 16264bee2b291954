"""`specwatch up`'s demo rules and phase alert (issue 55), without an engine: the TTFT threshold from this
machine's measured prefill and decode, MemoryFragmentationHigh left out on a CPU, and a phase's alert
counted only when it fires for the phase's drafter (read from an HTTP server answering as the collector)."""

from __future__ import annotations

import pytest
import yaml
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Route
from thread_server import ThreadServer

from specwatch.up import Stack, firing
from specwatch.up_rules import HEADROOM, Calibration, write_rules


def test_the_ttft_threshold_follows_the_measured_speed_never_below_the_shipped_one():
    slow = Calibration(prefill_s=0.5, decode_s=0.1, requests=3)
    assert slow.ttft_slo_s(0.3, concurrency=2) == pytest.approx(HEADROOM * 2 * 0.6)
    assert Calibration(0.01, 0.005, 3).ttft_slo_s(0.3, concurrency=1) == 0.3  # a fast GPU keeps the SLO


def test_cpu_rules_leave_fragmentation_out_and_say_so(tmp_path):
    path, said = write_rules(tmp_path, "http://127.0.0.1:9", True, Calibration(0.5, 0.1, 3), concurrency=2)
    rules = yaml.safe_load(path.read_text())
    names = {rule["name"]: rule for rule in rules["rules"]}
    assert "MemoryFragmentationHigh" not in names and names["TTFTP99High"]["threshold"] == 3.6
    assert "> 3.6 s (this machine's demo SLO)" in names["TTFTP99High"]["summary"]
    assert any("not applicable on a CPU" in line for line in said)
    assert any("prefill 500 ms, decode 100 ms/token" in line and "to 3.6 s" in line for line in said)
    gpu, _ = write_rules(tmp_path, "http://127.0.0.1:9", False, Calibration(0.01, 0.005, 3), concurrency=2)
    assert "MemoryFragmentationHigh" in {rule["name"] for rule in yaml.safe_load(gpu.read_text())["rules"]}


def test_a_phase_alert_counts_only_for_the_phases_drafter():
    alerts = [
        {"rule": "SpecAcceptanceLow", "state": "firing", "labels": {"drafter": "ngram"}},
        {"rule": "SpecAcceptanceLow", "state": "pending", "labels": {"drafter": "early-exit:2"}},
    ]
    app = Starlette(routes=[Route("/v1/alerts", lambda request: JSONResponse({"alerts": alerts}))])
    with ThreadServer(app) as server:
        stack = Stack(server.url, "http://127.0.0.1:9", None, [])
        assert firing(stack, "SpecAcceptanceLow", "ngram")
        assert not firing(stack, "SpecAcceptanceLow", "early-exit:2")
        alerts[1]["state"] = "firing"
        assert firing(stack, "SpecAcceptanceLow", "early-exit:2")
    assert not firing(stack, "SpecAcceptanceLow", "early-exit:2")  # no collector: not firing
