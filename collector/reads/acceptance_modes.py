"""Configurations where acceptance is not what it seems, read from each instance's latest config event.

- `lossy`: verification that accepts tokens the target would not have produced (vLLM
  `rejection_sample_method: fly`): acceptance measures a looser test.
- `forced`: acceptance made up by the engine (vLLM's synthetic rejection sampling: `rejection_sample_method:
  synthetic` in vLLM 0.33.0's `vllm/config/speculative.py`, whose `RejectionSampleMethod` is
  `Literal["standard", "synthetic", "block", "fly"]`, or a `method: synthetic`; SGLang's `SGLANG_SIMULATE_ACC_LEN`,
  TensorRT-LLM's `TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS`): a number the engine was told to produce.

The settings are looked for anywhere in the event's detail (a model card's `speculative_config`, an engine's
environment), by key. Acceptance alerts and the drift detector skip flagged instances (alerts/measures.py,
alerts/baselines.py); `GET /v1/speculation/activity` and the Sources page say why.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine, select

from specwatch.collector.models import EngineEventRow

LOSSY, FORCED = "lossy", "forced"
FORCING_SETTINGS = ("SGLANG_SIMULATE_ACC_LEN", "TLLM_SPEC_DECODE_FORCE_NUM_ACCEPTED_TOKENS")
LOOKBACK_S = 86400.0


@dataclass(frozen=True)
class Flag:
    """Why an instance's acceptance is not what it seems: its mode, the setting that says so, in words."""

    instance: str
    mode: str  # LOSSY | FORCED
    setting: str  # as found in the config event, e.g. `rejection_sample_method: fly`
    why: str


WHY = {
    LOSSY: "verification accepts tokens the target would not have produced, so acceptance measures a looser test",
    FORCED: "the engine was told which drafts to accept, so acceptance is a figure it was given, not measured",
}


def acceptance_mode(detail: object) -> str | None:
    """`forced`, `lossy` or None for one config event's detail (forced wins: its figure is made up)."""
    found = _evidence(detail)
    return found[0] if found else None


def _evidence(detail: object) -> tuple[str, str] | None:
    """(mode, the setting that says so) for one config event's detail; forced wins over lossy."""
    found = dict(_modes(detail))
    return next(((mode, found[mode]) for mode in (FORCED, LOSSY) if mode in found), None)


def _modes(node: object, depth: int = 0):
    if depth > 8:  # details are small JSON: a bound, not a limit met in practice
        return
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "rejection_sample_method" and value == "fly":
                yield LOSSY, f"{key}: {value}"
            elif (key in ("method", "rejection_sample_method") and value == "synthetic") or (
                key in FORCING_SETTINGS and value not in (None, "", 0, "0")
            ):
                yield FORCED, f"{key}: {value}"
            else:
                yield from _modes(value, depth + 1)
    elif isinstance(node, list):
        for value in node:
            yield from _modes(value, depth + 1)


def flagged_instances(db: Engine, end: float) -> dict[str, str]:
    """instance -> `lossy` | `forced`, by each instance's latest config event within LOOKBACK_S before `end`."""
    return {instance: flag.mode for instance, flag in flags(db, end).items()}


def flags(db: Engine, end: float) -> dict[str, Flag]:
    """instance -> its Flag, by each instance's latest config event within LOOKBACK_S before `end`."""
    e = EngineEventRow
    stmt = select(e.instance, e.detail).where(e.kind == "config", e.at >= end - LOOKBACK_S, e.at < end).order_by(e.at)
    with db.connect() as conn:
        latest = dict(conn.execute(stmt).all())
    found = {instance: _evidence(detail) for instance, detail in latest.items()}
    return {i: Flag(i, mode, str(setting)[:200], WHY[mode]) for i, (mode, setting) in _known(found)}


def _known(found: dict):
    return ((instance, evidence) for instance, evidence in found.items() if evidence)
