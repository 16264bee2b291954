"""GuideLLM (vLLM's benchmark client, PyPI `guidellm`) as a real peer: it drives `specwatch engine serve`
directly and through `specwatch gateway serve`, both reporting to a collector, and what the store says is
compared with what the client measured (issue 57).

    make guidellm          # builds .venv-guidellm once, then runs this with its defaults
    .venv/bin/python bench/guidellm_peer.py [--seconds 60] [--streams 1,2,4,8] [--formats chat,completions]
                                            [--targets engine,gateway] [--prompt-tokens 200] [--output-tokens 96]
                                            [--no-sync]

GuideLLM runs from `.venv-guidellm` (`make guidellm` builds it: its own venv, which sees the project venv's
torch and transformers through a .pth file); without it this prints why and exits 2. Its tokenizer is the
bundled SmolLM2 as an HF directory (`specwatch vllm prepare`'s, data/vllm-model), offline
(HF_HUB_OFFLINE=1): nothing is downloaded at run time.

Per target (engine, gateway) and request format (chat, completions): a synchronous benchmark, then one
at each number of concurrent streams, each `--seconds` long, synthetic prompts of `--prompt-tokens` and
`--output-tokens` (`ignore_eos` fixes the output length). Per benchmark, the client's figures (from
GuideLLM's JSON) beside the collector's over the benchmark's own window:
- errors: the client's errored requests; and the store's records with status `error`;
- requests: the client's completed + incomplete, and the records stored;
- TTFT median (ms) of the completed requests: the client's and the store's over the same requests, joined
  by id (a response's `id` is `chatcmpl-<request_id>`), both the usual median (the mean of the middle two);
  `guidellm` is GuideLLM's own summary p50 (an order statistic: with a dozen bimodal values, queued and not,
  it can sit far from the mean of the middle two); `join` says how many of the client's completed requests
  were found, `|d| p50/max` the per-request gaps |store - client| in ms;
- output tokens/s: the client's (output tokens over the benchmark's duration) and `/v1/signals`';
- cancelled: records stored `cancelled` (never more than the client's incomplete requests).
The goals (issue 57): 0 errors, stored = completed + incomplete, TTFT within 20 ms, tokens/s within 5%,
no completed stream stored as cancelled. Every row is printed as it comes; the table is also written
to bench/results/guidellm_peer.json. The exit code is 0 whatever the figures (a benchmark, not a test).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402

from specwatch.common import procs  # noqa: E402

GUIDELLM = REPO / ".venv-guidellm" / "bin" / "guidellm"
TOKENIZER_DIR = REPO / "data" / "vllm-model"
MODEL = "SmolLM2-135M-Instruct"
FORMATS = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}
FLUSH_S = 4.0  # the producers' telemetry flushes at least every second; a margin for their batches


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="length of each benchmark (default 60)")
    parser.add_argument("--streams", default="1,2,4,8", help="concurrent streams, after a synchronous run")
    parser.add_argument("--no-sync", action="store_true", help="skip the synchronous benchmark")
    parser.add_argument("--formats", default="chat,completions")
    parser.add_argument("--targets", default="engine,gateway")
    parser.add_argument("--prompt-tokens", type=int, default=200)
    parser.add_argument("--output-tokens", type=int, default=96)
    parser.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "guidellm_peer.json")
    return parser.parse_args(argv)


def missing() -> str | None:
    """Why GuideLLM cannot run here, else None."""
    if not GUIDELLM.exists():
        return f"{GUIDELLM.relative_to(REPO)} is missing: `make guidellm` builds it (PyPI guidellm==0.8.1)"
    return None


def tokenizer_dir() -> Path:
    """The bundled model as an HF directory (its tokenizer is GuideLLM's), made once."""
    if not (TOKENIZER_DIR / "tokenizer.json").exists():
        from specwatch.engine.hf_export import prepare

        prepare(TOKENIZER_DIR)
    return TOKENIZER_DIR


class Stack:
    """A collector (SQLite), an engine and a gateway in front of it, both reporting; stopped on exit."""

    def __init__(self, work: Path) -> None:
        self.work, self.processes = work, []
        self.db = work / "specwatch.db"

    def __enter__(self) -> Stack:
        ports = [procs.free_port() for _ in range(3)]
        self.collector, self.engine, self.gateway = (f"http://127.0.0.1:{p}" for p in ports)
        self.processes.append(procs.start_collector(ports[0], self.work / "collector.log", f"sqlite:///{self.db}"))
        engine = procs.specwatch_command("engine", "serve", "--port", str(ports[1]), "--collector", self.collector)
        engine += ["--instance", "bench-engine", "--spool-dir", str(self.work / "engine-spool")]
        self._start("engine", engine, f"{self.engine}/healthz")
        gateway = procs.specwatch_command("gateway", "serve", "--port", str(ports[2]), "--collector", self.collector)
        gateway += ["--upstream", f"e={self.engine},drafter=ngram", "--name", "bench-gw"]
        gateway += ["--spool-dir", str(self.work / "gateway-spool")]
        self._start("gateway", gateway, f"{self.gateway}/health")
        return self

    def _start(self, name: str, cmd: list[str], ready: str) -> None:
        log = self.work / f"{name}.log"
        self.processes.append(procs.start_service(name, cmd, procs.child_env(), log, ready, timeout_s=300))

    def __exit__(self, *exc) -> None:
        for process in reversed(self.processes):
            procs.stop_process(process)

    def url(self, target: str) -> str:
        return self.engine if target == "engine" else self.gateway


def run_guidellm(url: str, path: str, args: argparse.Namespace, out: Path) -> list[dict]:
    """One `guidellm run` (synchronous, then each stream count); its benchmarks from its JSON output."""
    streams = args.streams
    data = f"kind=synthetic_text,prompt_tokens={args.prompt_tokens},output_tokens={args.output_tokens}"
    common = [
        str(GUIDELLM), "run", "--disable-progress",
        "--backend", f"kind=openai_http,target={url},model={MODEL},request_format={path}",
        "--tokenizer", f"kind=huggingface_auto,model={tokenizer_dir()}",
        "--data", data,
        "--constraint", f"kind=max_duration,seconds={args.seconds:g}",
    ]  # fmt: skip
    benchmarks = []
    profiles = [["--profile", "kind=concurrent", "--override", "profile.streams", streams]]
    if not args.no_sync:
        profiles.insert(0, ["--profile", "kind=synchronous"])
    for profile in profiles:
        target = out.with_suffix(f".{profile[1].split('=')[1]}.json")
        env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
        command = [*common, *profile, "--output", f"kind=json,path={target}"]
        done = _run_group(command, env)
        if done.returncode != 0:
            raise RuntimeError(f"guidellm exited {done.returncode}: {done.stdout[-2000:]}{done.stderr[-2000:]}")
        benchmarks += json.loads(target.read_text())["benchmarks"]
    return benchmarks


def _run_group(command: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    """Run GuideLLM in its own process group, which goes whole (its worker processes too) if this is stopped."""
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        stdout, stderr = process.communicate()
    except BaseException:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        raise
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def client_figures(benchmark: dict) -> dict:
    """What GuideLLM measured in one benchmark."""
    metrics, totals = benchmark["metrics"], benchmark["metrics"]["request_totals"]
    output = metrics["output_token_count"]["total"]["total_sum"]
    strategy = benchmark["config"]["strategy"]
    return {
        "level": "sync" if strategy["type_"] == "synchronous" else f"{strategy['streams']} streams",
        "start": benchmark["start_time"],
        "end": benchmark["end_time"],
        "errors": totals["errored"],
        "completed": totals["successful"],
        "incomplete": totals["incomplete"],
        "ttft_ms": metrics["time_to_first_token_ms"]["successful"]["median"],
        "output_tok_s": output / benchmark["duration"],
        "client_ttft_by_id": dict(filter(None, map(_client_ttft, benchmark["requests"]["successful"]))),
    }


def _client_ttft(request: dict) -> tuple[str, float] | None:
    """(the engine's request_id, the client's TTFT in ms) of one completed request GuideLLM kept."""
    timings, response_id = request["info"]["timings"], request.get("response_id") or ""
    start, first = timings.get("request_start"), timings.get("first_token_iteration")
    if not response_id or start is None or first is None:
        return None
    return response_id.partition("-")[2], (first - start) * 1000


def stored_figures(stack: Stack, start: float, end: float, client_ttft_by_id: dict[str, float]) -> dict:
    """What the collector stored of the requests that started in [start, end), and the TTFT it stored
    for each of the client's completed requests (joined by request id)."""
    signals = httpx.get(f"{stack.collector}/v1/signals", params={"start": start, "end": end}, timeout=60).json()
    within = "started_at >= ? AND started_at < ?"
    with sqlite3.connect(stack.db) as conn:
        statuses = dict(
            conn.execute(f"SELECT status, count(*) FROM requests WHERE {within} GROUP BY status", (start, end))
        )
        ids = list(client_ttft_by_id)
        marks = ",".join("?" * len(ids))
        stored = dict(conn.execute(f"SELECT request_id, ttft_s FROM requests WHERE request_id IN ({marks})", ids))
    pairs = [(client_ttft_by_id[i], t * 1000) for i, t in stored.items() if t is not None]
    gaps = sorted(abs(s - c) for c, s in pairs)
    return {
        "stored": signals["requests"],
        "stored_errors": statuses.get("error", 0),
        "stored_cancelled": statuses.get("cancelled", 0),
        "joined": len(pairs),
        "stored_ttft_ms": statistics.median(s for _, s in pairs) if pairs else None,
        "joined_client_ttft_ms": statistics.median(c for c, _ in pairs) if pairs else None,
        "gap_p50_ms": statistics.median(gaps) if gaps else None,
        "gap_max_ms": gaps[-1] if gaps else None,
        "stored_output_tok_s": signals["output_tokens_per_s"],
    }


def verdict(row: dict) -> list[str]:
    """The goals a row misses (issue 57)."""
    misses = []
    if row["errors"] or row["stored_errors"]:
        misses.append("errors")
    if row["stored"] != row["completed"] + row["incomplete"]:
        misses.append("stored != completed + incomplete")
    if row["joined"] < row["completed"]:
        misses.append(f"{row['completed'] - row['joined']} completed not found by id")
    if row["stored_ttft_ms"] is not None and abs(row["stored_ttft_ms"] - row["joined_client_ttft_ms"]) > 20:
        misses.append("TTFT off by > 20 ms")
    if row["output_tok_s"] and abs(row["stored_output_tok_s"] / row["output_tok_s"] - 1) > 0.05:
        misses.append("tok/s off by > 5%")
    if row["stored_cancelled"] > row["incomplete"]:
        misses.append("a completed stream stored as cancelled")
    return misses


HEADER = (
    f"{'target':8} {'format':11} {'level':10} {'err':>3} {'done+cut':>8} {'stored':>6} {'cancl':>5} "
    f"{'TTFT ms':>8} {'stored':>8} {'guidellm':>8} {'join':>4} {'|d| p50/max':>11} {'tok/s':>7} {'stored':>7}  misses"
)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}"


def line(row: dict) -> str:
    gaps = f"{_ms(row['gap_p50_ms'])}/{_ms(row['gap_max_ms'])}"
    return (
        f"{row['target']:8} {row['format']:11} {row['level']:10} {row['errors'] + row['stored_errors']:>3} "
        f"{row['completed']:>4}+{row['incomplete']:<3} {row['stored']:>6} {row['stored_cancelled']:>5} "
        f"{_ms(row['joined_client_ttft_ms']):>8} {_ms(row['stored_ttft_ms']):>8} {row['ttft_ms']:>8.0f} "
        f"{row['joined']:>4} {gaps:>11} "
        f"{row['output_tok_s']:>7.1f} {row['stored_output_tok_s']:>7.1f}  " + (", ".join(row["misses"]) or "-")
    )


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if reason := missing():
        print(f"guidellm_peer: {reason}", file=sys.stderr)
        return 2
    rows = []
    with tempfile.TemporaryDirectory(prefix="guidellm-peer-") as folder, Stack(Path(folder)) as stack:
        print(HEADER, flush=True)
        for target in args.targets.split(","):
            for name in args.formats.split(","):
                benchmarks = run_guidellm(stack.url(target), FORMATS[name], args, Path(folder) / f"{target}-{name}")
                time.sleep(FLUSH_S)  # the producers' last records reach the collector
                for benchmark in benchmarks:
                    row = {"target": target, "format": name, **client_figures(benchmark)}
                    row |= stored_figures(stack, row["start"], row["end"], row.pop("client_ttft_by_id"))
                    row["misses"] = verdict(row)
                    rows.append(row)
                    print(line(row), flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a stop still takes the stack down in order
    sys.exit(main())
