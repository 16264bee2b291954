"""The CUDA paths: stream priorities, the memory fraction, defragmentation, device samples, NVML power.

Tests marked `cuda` run only where torch sees a GPU and are skipped (with the reason) elsewhere;
the CPU tests check that the same code degrades to clear no-ops, and the control API's answers.
"""

from __future__ import annotations

import asyncio
import importlib.util
import sys
from types import SimpleNamespace

import httpx
import pytest
import torch
from engine_harness import BackgroundServer

from specwatch.engine import control
from specwatch.engine.cuda import NoCudaStreams, Streams, apply_memory_fraction, check_memory_fraction
from specwatch.engine.engine import EngineConfig
from specwatch.engine.policy import PolicyConfig
from specwatch.engine.scheduler import SchedulerConfig
from specwatch.telemetry.schema import EngineEvent
from specwatch.telemetry.sink import TelemetrySink

HAS_CUDA = torch.cuda.is_available()
_no_cuda = pytest.mark.skipif(
    not HAS_CUDA, reason="no CUDA device (torch.cuda.is_available() is False): run on a machine with an NVIDIA GPU"
)


def needs_cuda(test):
    return pytest.mark.cuda(_no_cuda(test))


needs_nvml = pytest.mark.skipif(
    importlib.util.find_spec("pynvml") is None, reason="nvidia-ml-py not installed: pip install -e '.[engine,gpu]'"
)
AUTH = {"authorization": "Bearer s3cret"}


# --- CPU: everything CUDA-only is a clear no-op ---------------------------------------------------


def test_streams_on_a_cpu_are_no_ops_and_say_so():
    streams = Streams("cpu")
    with streams.target(), streams.draft():
        assert (torch.ones(3) * 2).sum().item() == 6
    described = streams.describe()
    assert described["enabled"] is False and described["device"] == "cpu"
    assert described["target_priority"] is None and described["priority_range"] is None
    assert "no CUDA streams" in described["reason"]
    with pytest.raises(NoCudaStreams, match="device cpu has no CUDA streams"):
        streams.configure("high", "low")


@pytest.mark.parametrize("bad", [0, 0.0, -0.1, 1.01, float("nan"), float("inf"), True, "0.5", None])
def test_memory_fraction_is_validated(bad):
    with pytest.raises(ValueError, match=r"memory fraction must be in \(0, 1\]"):
        apply_memory_fraction("cpu", bad)
    with pytest.raises(ValueError):
        EngineConfig(memory_fraction=bad)


def test_memory_fraction_is_not_applied_on_a_cpu():
    done = apply_memory_fraction("cpu", 0.5)
    assert done["applied"] is False and done["fraction"] == 0.5 and "not applicable on cpu" in done["reason"]
    assert check_memory_fraction(1) == 1.0


@pytest.fixture(scope="module")
def guarded(bundled_engine):
    events = []
    server = BackgroundServer(
        bundled_engine, SchedulerConfig(slots=2, max_queue=4), PolicyConfig(), control_token="s3cret"
    )
    server.sink.subscribe(EngineEvent, lambda event: events.append((event.kind, event.detail)))
    with server:
        server.events = events
        yield server


def test_streams_endpoint_requires_the_token(guarded):
    assert httpx.post(f"{guarded.url}/v1/control/streams", json={"target": "high", "draft": "low"}).status_code == 401
    wrong = httpx.post(f"{guarded.url}/v1/control/streams", json={}, headers={"authorization": "Bearer nope"})
    assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "authentication_error"


@pytest.mark.parametrize(
    "body", [{"target": "highest"}, {"draft": 3}, {"target": "high", "draft": "low", "extra": 1}, []]
)
def test_streams_endpoint_rejects_bad_bodies(guarded, body):
    # the engine answers every invalid body with an OpenAI-style 400 (its one validation handler)
    answer = httpx.post(f"{guarded.url}/v1/control/streams", json=body, headers=AUTH)
    assert answer.status_code == 400 and answer.json()["error"]["type"] == "invalid_request_error"


def test_streams_endpoint_on_a_cpu_engine_is_409_and_changes_nothing(guarded):
    before = len(guarded.events)
    answer = httpx.post(f"{guarded.url}/v1/control/streams", json={"target": "high", "draft": "low"}, headers=AUTH)
    assert answer.status_code == 409
    assert answer.json()["error"]["message"].startswith("device cpu has no CUDA streams")
    assert len(guarded.events) == before  # no event for an action that did nothing
    state = httpx.get(f"{guarded.url}/v1/control/state", headers=AUTH).json()
    assert state["streams"]["enabled"] is False
    reply = guarded.client().completions.create(model=None, prompt="Hi", max_tokens=3, temperature=0)
    assert reply.choices[0].finish_reason in ("stop", "length")  # still serving


def test_streams_action_emits_an_event_where_streams_exist():
    sink, events = TelemetrySink("gpu-0"), []
    sink.subscribe(EngineEvent, events.append)
    engine = SimpleNamespace(
        streams=SimpleNamespace(
            configure=lambda t, d: {"before": {"target": "low"}, "after": {"target": t, "draft": d}}
        )
    )
    report = control.set_streams(SimpleNamespace(engine=engine), sink.emit, "high", "low")
    assert report["after"] == {"target": "high", "draft": "low"}
    assert [(e.instance, e.kind, e.duration_s) for e in events] == [("gpu-0", "streams", report["duration_s"])]


# --- CUDA ----------------------------------------------------------------------------------------


@pytest.fixture
def restore_fraction():
    yield
    if HAS_CUDA:
        torch.cuda.set_per_process_memory_fraction(1.0)
        torch.cuda.empty_cache()


@needs_cuda
def test_cuda_streams_have_the_priorities_they_describe():
    streams = Streams("cuda")
    least, greatest = torch.cuda.Stream.priority_range()
    described = streams.describe()
    assert described["enabled"] and described["priority_range"] == [least, greatest]
    assert (described["target_priority"], described["draft_priority"]) == (greatest, least)
    assert streams.target_stream.priority == greatest and streams.draft_stream.priority == least
    with streams.draft():
        assert torch.cuda.current_stream() == streams.draft_stream
    with streams.target():
        assert torch.cuda.current_stream() == streams.target_stream
    assert torch.cuda.current_stream() == torch.cuda.default_stream()
    change = streams.configure(target="low", draft="high")
    assert change["before"]["target_priority"] == greatest and change["after"]["draft_priority"] == greatest


@needs_cuda
def test_work_across_the_streams_is_ordered():
    streams = Streams("cuda")
    for _ in range(5):
        x = torch.randn(2048, 2048, device="cuda")  # made on the default stream
        expected = (x @ x).sum().item()
        with streams.draft():
            y = x @ x  # must wait for x
        with streams.target():
            total = y.sum()  # must wait for the draft stream's y
        assert total.item() == pytest.approx(expected, rel=1e-3)


@needs_cuda
def test_memory_fraction_is_honoured(restore_fraction):
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    fraction = (torch.cuda.memory_reserved() + 256 * 2**20) / total
    done = apply_memory_fraction("cuda", fraction)
    assert done["applied"] and torch.cuda.get_per_process_memory_fraction() == pytest.approx(fraction)
    small = torch.empty(64 * 2**20, dtype=torch.uint8, device="cuda")  # under the cap
    with pytest.raises(torch.OutOfMemoryError):
        torch.empty(done["limit_bytes"] + 2**30, dtype=torch.uint8, device="cuda")  # fits the GPU, not the cap
    del small


@needs_cuda
def test_used_fraction_counts_against_the_cap(restore_fraction):
    from specwatch.engine.memory_guard import used_fraction

    block = torch.empty(512 * 2**20, dtype=torch.uint8, device="cuda")
    apply_memory_fraction(
        "cuda", (torch.cuda.memory_reserved() + 64 * 2**20) / torch.cuda.get_device_properties(0).total_memory
    )
    assert used_fraction(torch.device("cuda")) > 0.85  # of the cap, whatever the rest of the GPU holds
    del block


def _stub_scheduler(device: torch.device):
    return SimpleNamespace(
        engine=SimpleNamespace(target=SimpleNamespace(device=device)),
        busy=SimpleNamespace(target_s=0.0, draft_s=0.0),
        active=0,
        queue_depth=0,
        load=0.0,
        policy=SimpleNamespace(state={"load_allows_speculation": True}),
    )


@needs_cuda
def test_defragment_releases_cached_blocks():
    torch.cuda.empty_cache()
    keep = [torch.empty(n * 2**20, dtype=torch.uint8, device="cuda") for n in (3, 17, 5, 41, 9, 66, 2, 30)]
    del keep[1::2]  # free every other block: reserved stays, allocated drops
    events = []
    report = control.defragment(_stub_scheduler(torch.device("cuda")), lambda *event: events.append(event))
    assert report["action"] == "torch.cuda.empty_cache" and [e[0] for e in events] == ["defrag"]
    assert report["before"]["reserved"] > report["before"]["allocated"]
    assert report["after"]["reserved"] < report["before"]["reserved"]
    assert report["after"]["fragmentation"] <= report["before"]["fragmentation"]


@needs_cuda
def test_device_sample_matches_torch_memory_stats():
    from specwatch.engine.device import DeviceSampler

    block = torch.empty(100 * 2**20, dtype=torch.uint8, device="cuda")
    sampler = DeviceSampler(_stub_scheduler(torch.device("cuda")), TelemetrySink("gpu-test"), 1.0)
    sample = sampler.sample()
    stats = torch.cuda.memory_stats()
    assert sample.mem_allocated_bytes == stats["allocated_bytes.all.current"]
    assert sample.mem_reserved_bytes == stats["reserved_bytes.all.current"]
    assert sample.fragmentation == pytest.approx(
        stats["reserved_bytes.all.current"] / stats["allocated_bytes.all.current"]
    )
    assert sample.device == torch.cuda.get_device_name(0)[:128]
    del block


@needs_nvml
@needs_cuda
def test_power_comes_from_nvml():
    import time

    from specwatch.engine.device import PowerMeter

    meter = PowerMeter(torch.device("cuda"))
    assert meter.source == "nvml"
    x = torch.randn(4096, 4096, device="cuda")
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        x = torch.tanh(x @ x)
    torch.cuda.synchronize()
    watts = meter.watts()
    assert watts is not None and 1.0 < watts < 2000.0


@needs_cuda
def test_a_draft_oom_under_the_memory_fraction_is_retried_plain(restore_fraction):
    """A real torch.OutOfMemoryError in the draft stage (an allocation beyond the process's cap)."""
    from specwatch.engine.engine import Engine, GenerateRequest, GenerateResult
    from specwatch.engine.policy import Policy
    from specwatch.engine.scheduler import Scheduler

    engine = Engine(EngineConfig(dtype="float32", device="cuda", instance="cuda-test"))
    scheduler = Scheduler(engine, SchedulerConfig(slots=2, max_queue=2), Policy(PolicyConfig()))
    for slot in scheduler.slots:
        slot.drafters["ngram"] = _Greedy(engine.config.ngram)
    torch.cuda.empty_cache()
    cap = apply_memory_fraction(
        "cuda", (torch.cuda.memory_reserved() + 256 * 2**20) / torch.cuda.get_device_properties(0).total_memory
    )

    async def one():
        ticket = scheduler.submit(
            GenerateRequest(prompt="Repeat: a b c a b c a b c", max_tokens=8, drafter="ngram", gamma=4),
            asyncio.get_running_loop(),
        )
        while not isinstance(item := await ticket.events.get(), (GenerateResult, Exception)):
            pass
        return item

    scheduler.start()
    try:
        result = asyncio.run(one())
    finally:
        scheduler.stop()
    assert cap["applied"]
    record = result.record
    assert (record.status, record.retries, record.error, record.mode) == ("ok", 1, "draft:oom", "speculative")


class _Greedy:
    """An n-gram drafter whose first proposal allocates 2 GiB: beyond a small memory fraction."""

    def __init__(self, config) -> None:
        from specwatch.engine.drafters import NgramDrafter

        self.inner, self.calls, self.name = NgramDrafter(config), 0, "ngram"

    def begin(self, max_len: int) -> None:
        self.inner.begin(max_len)

    def propose(self, tokens, k, params, generator):
        self.calls += 1
        if self.calls == 1:
            torch.empty(2 * 2**30, dtype=torch.uint8, device="cuda")
        return self.inner.propose(tokens, k, params, generator)

    def rollback(self, committed: int) -> None:
        self.inner.rollback(committed)


# --- the device sampler and bench/gpu_check.py ------------------------------------------------------


def test_device_sample_reports_whether_the_drafts_are_loaded():
    from specwatch.engine.device import DeviceSampler

    scheduler = _stub_scheduler(torch.device("cpu"))
    scheduler.policy.state["draft_loaded"] = False
    sample = DeviceSampler(scheduler, TelemetrySink("laptop"), 1.0).sample()
    assert sample.draft_loaded is False and sample.power_source in (None, "rapl", "estimate")


def _gpu_check():
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / "gpu_check.py"
    spec = importlib.util.spec_from_file_location("gpu_check", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(HAS_CUDA, reason="checks the message given where CUDA is absent")
def test_gpu_check_without_cuda_says_so_and_exits_0(tmp_path, capsys):
    assert _gpu_check().main(["--out", str(tmp_path / "out.json")]) == 0
    assert "gpu_check skipped: CUDA is not available" in capsys.readouterr().out
    assert not (tmp_path / "out.json").exists()


@pytest.mark.slow
def test_gpu_check_dry_run_on_a_cpu_completes(tmp_path):
    import json

    out = tmp_path / "gpu_check.json"
    assert (
        _gpu_check().main(["--device", "cpu", "--dry-run", "--max-tokens", "8", "--burst", "3", "--out", str(out)]) == 0
    )
    rows = {row["check"]: row for row in json.loads(out.read_text())["rows"]}
    assert rows["greedy identity fp32"]["status"] == "ok" and rows["draft OOM retried plain"]["status"] == "ok"
    assert rows["streams"]["status"] == "skip" and not [r for r in rows.values() if r["status"] == "error"]
