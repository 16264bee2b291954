"""Record per-request acceptance from the bundled engine, for bench/drift.py's synthetic streams.

    python bench/drift_record.py [--requests 60] [--max-tokens 48] [--out bench/data/engine_acceptance.jsonl]

Runs real requests through the engine (SmolLM2-135M, 1 thread): every workload prompt kind and
templated support replies, greedy and sampled, with the n-gram drafter, then a few with an untrained
early exit (the "bad drafter"). Writes one JSON line per request: drafter, scenario, drafted and
accepted tokens, drafts, output tokens, accepted per position. bench/drift_record_vllm.py records the
second pool, from a real vLLM.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.engine import templated_requests  # noqa: E402
from specwatch.engine.engine import Engine, EngineConfig, GenerateRequest  # noqa: E402
from specwatch.engine.sampling import SamplingParams  # noqa: E402
from specwatch.workload import PROMPTS, chat  # noqa: E402

OUT = Path(__file__).with_name("data") / "engine_acceptance.jsonl"


def workload(count: int) -> list[tuple[str, list[dict[str, str]]]]:
    kinds = [(kind, chat(kind)) for kind in PROMPTS]
    templated = [("support", messages) for messages in templated_requests(count)]
    mixed = [item for pair in zip(templated, kinds * count) for item in pair]
    return mixed[:count]


def record(engine: Engine, scenario: str, messages, drafter: str, seed: int, max_tokens: int) -> dict:
    temperature = 0.0 if seed % 3 == 0 else 0.7
    request = GenerateRequest(
        messages=messages,
        max_tokens=max_tokens,
        drafter=drafter,
        gamma=4,
        sampling=SamplingParams(temperature=temperature),
        seed=seed,
    )
    r = engine.generate(request).record
    return {
        "drafter": drafter,
        "scenario": scenario,
        "temperature": temperature,
        "num_draft_tokens": r.num_draft_tokens,
        "num_accepted_tokens": r.num_accepted_tokens,
        "num_drafts": r.num_drafts,
        "output_tokens": r.output_tokens,
        "accepted_per_position": list(r.accepted_per_position),
        "e2e_s": r.e2e_s,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=60)
    parser.add_argument("--bad", type=int, default=12, help="requests with the untrained early exit")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    engine = Engine(EngineConfig(threads=1, instance="drift-record"))
    plan = [(s, m, "ngram") for s, m in workload(args.requests)]
    plan += [(s, m, "early-exit:4") for s, m in workload(args.bad)]
    with args.out.open("w") as out:
        for seed, (scenario, messages, drafter) in enumerate(plan):
            row = record(engine, scenario, messages, drafter, seed, args.max_tokens)
            out.write(json.dumps(row) + "\n")
            out.flush()
            print(seed, scenario, drafter, row["num_accepted_tokens"], "/", row["num_draft_tokens"], file=sys.stderr)


if __name__ == "__main__":
    main()
