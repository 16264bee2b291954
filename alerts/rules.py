"""Alert rules as data: a YAML file validated into one frozen `AlertConfig`.

The shipped defaults live in `default_rules.yaml`; `SPECWATCH_ALERT_RULES` (or `--rules`)
replaces them with a user file. Anything wrong in the file (an unknown signal, a label the
signal cannot be grouped by, a bad duration or threshold) is a `RulesError` naming the rule
and field, so `specwatch alerts check` can print it and exit 2.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from specwatch.alerts.detector_settings import DetectorSettings
from specwatch.alerts.durations import Duration, format_duration, parse_duration
from specwatch.alerts.signals import SIGNALS

__all__ = ["Duration", "RulesError", "format_duration", "parse_duration"]

DEFAULT_RULES = Path(__file__).with_name("default_rules.yaml")
ACTIONS = (
    "fallback_autoregressive",
    "restore_speculative",
    "defragment",
    "unload_draft",
    "rebalance_streams",
    "recommend_draft_retraining",
)


class RulesError(ValueError):
    """An invalid rules file; the message names the rule and field."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Rule(_Strict):
    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", max_length=128)
    signal: str
    op: Literal["<", "<=", ">", ">="]
    threshold: float = Field(allow_inf_nan=False)
    window: Duration = Field(gt=0)
    for_: Duration = Field(default=0.0, alias="for")
    keep_firing_for: Duration = 0.0
    min_samples: int = Field(default=1, ge=0)
    group_by: tuple[str, ...] = ()
    severity: Literal["info", "warning", "critical"] = "warning"
    summary: str = ""
    description: str = ""
    actions: tuple[Literal[ACTIONS], ...] = ()  # type: ignore[valid-type]

    @field_validator("signal")
    @classmethod
    def _known_signal(cls, signal: str) -> str:
        if signal not in SIGNALS:
            raise ValueError(f"unknown signal {signal!r}; known: {', '.join(sorted(SIGNALS))}")
        return signal

    @model_validator(mode="after")
    def _groupable(self) -> Rule:
        labels = SIGNALS[self.signal].labels
        if bad := [label for label in self.group_by if label not in labels]:
            raise ValueError(f"signal {self.signal} cannot be grouped by {bad}; it has labels {list(labels)}")
        return self

    def holds(self, value: float) -> bool:
        """Is the alert condition met by this value?"""
        return {
            "<": value < self.threshold,
            "<=": value <= self.threshold,
            ">": value > self.threshold,
            ">=": value >= self.threshold,
        }[self.op]


class Receiver(_Strict):
    """A webhook: Alertmanager v4 JSON (or Slack-compatible text/blocks), HMAC-signed with the secret."""

    name: str = Field(min_length=1, max_length=64)
    url: str = Field(pattern=r"^https?://")
    secret: str | None = None
    secret_env: str | None = None
    format: Literal["alertmanager", "slack"] = "alertmanager"
    match: dict[str, str] = Field(default_factory=dict)  # only alerts whose labels have these values
    max_attempts: int = Field(default=8, ge=1, le=100)
    retry_backoff: Duration = Field(default=5.0, gt=0)  # first retry delay, doubling up to 10 minutes
    timeout: Duration = 10.0

    def resolved_secret(self) -> str | None:
        return self.secret or (os.environ.get(self.secret_env) if self.secret_env else None)

    def wants(self, labels: dict[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in self.match.items())


class Remediation(_Strict):
    cooldown: Duration = 90.0
    token_env: str = "SPECWATCH_CONTROL_TOKEN"
    engines: dict[str, str] = Field(default_factory=dict)  # instance ("*": any) -> engine base URL
    timeout: Duration = 10.0

    def engine_url(self, instance: str | None) -> str | None:
        return self.engines.get(instance or "", self.engines.get("*"))

    def token(self) -> str | None:
        return os.environ.get(self.token_env)


class Evaluation(_Strict):
    interval: Duration = Field(default=15.0, gt=0)
    repeat_interval: Duration = Field(default=4 * 3600.0, gt=0)
    resolved_retention: Duration = Field(default=15 * 60.0, ge=0)


class AlertConfig(_Strict):
    evaluation: Evaluation = Evaluation()
    rules: tuple[Rule, ...] = ()
    receivers: tuple[Receiver, ...] = ()
    remediation: Remediation = Remediation()
    detectors: DetectorSettings = DetectorSettings()  # drift, regression at markers, per-request anomalies

    @model_validator(mode="after")
    def _unique_names(self) -> AlertConfig:
        for kind, names in (("rule", [r.name for r in self.rules]), ("receiver", [r.name for r in self.receivers])):
            if dupes := sorted({n for n in names if names.count(n) > 1}):
                raise ValueError(f"duplicate {kind} names: {dupes}")
        return self

    def rule(self, name: str) -> Rule:
        return next(r for r in self.rules if r.name == name)


def load_config(path: str | Path | None = None) -> AlertConfig:
    """Load and validate a rules file (default: `SPECWATCH_ALERT_RULES`, else the shipped one)."""
    path = Path(path or os.environ.get("SPECWATCH_ALERT_RULES") or DEFAULT_RULES)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise RulesError(f"cannot read rules file {path}: {exc.strerror}") from None
    except yaml.YAMLError as exc:
        raise RulesError(f"{path}: not valid YAML: {exc}") from None
    return parse_config(data, str(path))


def parse_config(data: object, origin: str = "rules") -> AlertConfig:
    if not isinstance(data, dict):
        raise RulesError(f"{origin}: expected a mapping with 'rules:', got {type(data).__name__}")
    try:
        return AlertConfig.model_validate(data)
    except ValidationError as exc:
        raise RulesError(f"{origin}: " + "; ".join(_describe(data, e) for e in exc.errors())) from None


def _describe(data: dict, error: dict) -> str:
    """'rules[2] (TTFTP99High).threshold: Input should be a valid number'"""
    loc = list(error["loc"])
    where = ""
    for i, part in enumerate(loc):
        if isinstance(part, int):
            where += f"[{part}]"
            item = (
                data.get(loc[0], [None] * (part + 1))[part] if i == 1 and isinstance(data.get(loc[0]), list) else None
            )
            if isinstance(item, dict) and "name" in item:
                where += f" ({item['name']})"
        else:
            where += f".{part}" if where else str(part)
    return f"{where}: {error['msg'].removeprefix('Value error, ')}"
