"""Configurations where acceptance is not what it seems, read from each instance's latest config event.

- `lossy`: verification that accepts tokens the target would not have produced (vLLM
  `rejection_sample_method: fly`): acceptance measures a looser test.
- `forced`: acceptance made up by the engine (vLLM's `synthetic` method, SGLang's `SGLANG_SIMULATE_ACC_LEN`,
  TensorRT-LLM's `TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS`): a number the engine was told to produce.

The settings are looked for anywhere in the event's detail (a model card's `speculative_config`, an engine's
environment), by key. Acceptance alerts and the drift detector skip flagged instances (alerts/measures.py,
alerts/baselines.py); `GET /v1/speculation/activity` and the Sources page say why.
"""

from __future__ import annotations

from sqlalchemy import Engine, select

from specwatch.collector.models import EngineEventRow

LOSSY, FORCED = "lossy", "forced"
FORCING_SETTINGS = ("SGLANG_SIMULATE_ACC_LEN", "TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS")
LOOKBACK_S = 86400.0


def acceptance_mode(detail: object) -> str | None:
    """`forced`, `lossy` or None for one config event's detail (forced wins: its figure is made up)."""
    found = set(_modes(detail))
    return FORCED if FORCED in found else LOSSY if LOSSY in found else None


def _modes(node: object, depth: int = 0):
    if depth > 8:  # details are small JSON: a bound, not a limit met in practice
        return
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "rejection_sample_method" and value == "fly":
                yield LOSSY
            elif (key == "method" and value == "synthetic") or (
                key in FORCING_SETTINGS and value not in (None, "", 0, "0")
            ):
                yield FORCED
            else:
                yield from _modes(value, depth + 1)
    elif isinstance(node, list):
        for value in node:
            yield from _modes(value, depth + 1)


def flagged_instances(db: Engine, end: float) -> dict[str, str]:
    """instance -> `lossy` | `forced`, by each instance's latest config event within LOOKBACK_S before `end`."""
    e = EngineEventRow
    stmt = select(e.instance, e.detail).where(e.kind == "config", e.at >= end - LOOKBACK_S, e.at < end).order_by(e.at)
    with db.connect() as conn:
        latest = dict(conn.execute(stmt).all())
    return {instance: mode for instance, detail in latest.items() if (mode := acceptance_mode(detail))}
