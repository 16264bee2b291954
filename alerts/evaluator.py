"""The alert state machine, Prometheus semantics (rules/alerting.go), as a pure function.

`evaluate(now, rule, samples, alerts)` takes the rule's previous alerts (keyed by the
fingerprint of their label set) and this cycle's samples, and returns the new alerts and
the transitions between them. States are ordered inactive < pending < firing:

- a sample meeting the condition (and `min_samples`) makes a new alert pending; once it has
  been active for the rule's `for` it fires (`for: 0` fires at once);
- a pending alert whose condition stops is dropped; a firing one keeps firing while
  `keep_firing_for` has not passed since the condition last held, then resolves
  (state inactive, `resolved_at`), and is kept `resolved_retention` so "resolved" is sent;
- `needs_sending` says when a notifier must (re)send: on firing, every `repeat_interval`
  while firing, and once on resolve.

A rule whose signal failed keeps its alerts unchanged (as Prometheus does on a query error).
"""

from __future__ import annotations

import hashlib
import html
import re
from dataclasses import dataclass, field, replace
from enum import StrEnum

from specwatch.alerts.rules import Rule
from specwatch.alerts.signals import Labels, Reading


class State(StrEnum):
    """Stored and served by name; `rank` orders them inactive < pending < firing."""

    INACTIVE = "inactive"
    PENDING = "pending"
    FIRING = "firing"

    @property
    def rank(self) -> int:
        return tuple(State).index(self)


@dataclass(frozen=True)
class Alert:
    """One alert of one rule: what the evaluator returns, the store keeps and `GET /v1/alerts` serves."""

    rule: str
    fingerprint: str
    labels: dict[str, str]
    annotations: dict[str, str]
    state: State
    value: float
    active_at: float
    last_seen_at: float  # the last evaluation where the condition held
    fired_at: float | None = None
    resolved_at: float | None = None
    last_sent_at: float | None = None


@dataclass(frozen=True)
class Transition:
    at: float
    rule: str
    fingerprint: str
    labels: dict[str, str]
    from_state: State
    to_state: State
    value: float


@dataclass(frozen=True)
class Outcome:
    alerts: dict[str, Alert]
    transitions: list[Transition] = field(default_factory=list)
    error: str | None = None


def alert_labels(rule: Rule, sample_labels: Labels) -> dict[str, str]:
    return {"alertname": rule.name, "severity": rule.severity, **dict(sample_labels)}


def fingerprint(labels: dict[str, str]) -> str:
    """Stable hash of a label set (16 hex digits, like Alertmanager's fingerprints)."""
    text = "\xff".join(f"{k}\xfe{v}" for k, v in sorted(labels.items()))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def as_text(value: str) -> str:
    """A producer's string made inert for a receiver that renders Slack mrkdwn or HTML: `&`, `<`, `>`
    as entities (Slack's escaping, and HTML's outside attributes)."""
    return html.escape(value, quote=False)


_TEMPLATE = re.compile(r"{{\s*\$(value|labels\.(\w+))\s*}}")


def render(template: str, labels: dict[str, str], value: float) -> str:
    """Fill `{{ $value }}` and `{{ $labels.name }}` (the subset of Prometheus templates rules use).

    Label values come from producers (a drafter `model:<!channel>`): they go in `as_text`, so an
    annotation a receiver renders shows them as text, never as a mention, a link or a tag. The labels
    themselves stay raw (they are data, matched on by receivers)."""
    return _TEMPLATE.sub(
        lambda m: f"{value:.3g}" if m.group(1) == "value" else as_text(labels.get(m.group(2), "")), template
    )


def evaluate(
    now: float,
    rule: Rule,
    samples: list[Reading] | Exception,
    alerts: dict[str, Alert],
    resolved_retention: float = 900.0,
) -> Outcome:
    """One evaluation of `rule` at `now`; `alerts` are the rule's alerts after the previous one."""
    if isinstance(samples, Exception):
        return Outcome(dict(alerts), [], f"{type(samples).__name__}: {samples}")
    new, transitions = dict(alerts), []
    seen = set()
    for sample in samples:
        if sample.count < rule.min_samples or not sample.significant or not rule.holds(sample.value):
            continue
        labels = alert_labels(rule, sample.labels)
        fp = fingerprint(labels)
        seen.add(fp)
        annotations = {
            **{key: as_text(value) for key, value in sample.annotations},  # a marker's version: a producer's
            "summary": render(rule.summary, labels, sample.value),
            "description": render(rule.description, labels, sample.value),
        }
        previous = new.get(fp)
        if previous is not None and previous.state != State.INACTIVE:
            new[fp] = replace(previous, value=sample.value, annotations=annotations, last_seen_at=now)
        else:  # a new alert (or a resolved one active again: a fresh alert, as in Prometheus)
            new[fp] = Alert(rule.name, fp, labels, annotations, State.PENDING, sample.value, now, now)
            transitions.append(Transition(now, rule.name, fp, labels, State.INACTIVE, State.PENDING, sample.value))
    for fp, alert in list(new.items()):
        _step(now, rule, alert, fp in seen, new, transitions, resolved_retention)
    return Outcome(new, transitions)


def _step(
    now: float,
    rule: Rule,
    alert: Alert,
    active: bool,
    alerts: dict[str, Alert],
    transitions: list[Transition],
    resolved_retention: float,
) -> None:
    """Advance one alert: pending -> firing after `for`, drop or resolve when no longer active."""

    def move(to: State, **changes) -> None:
        transitions.append(Transition(now, rule.name, alert.fingerprint, alert.labels, alert.state, to, alert.value))
        alerts[alert.fingerprint] = replace(alert, state=to, **changes)

    if active:
        if alert.state == State.PENDING and now - alert.active_at >= rule.for_:
            move(State.FIRING, fired_at=now)
    elif alert.state == State.PENDING:  # never fired: dropped, nothing to send
        move(State.INACTIVE)
        del alerts[alert.fingerprint]
    elif alert.state == State.FIRING:
        if now - alert.last_seen_at >= rule.keep_firing_for:
            move(State.INACTIVE, resolved_at=now)
    elif alert.resolved_at is not None and now - alert.resolved_at > resolved_retention:
        del alerts[alert.fingerprint]


def needs_sending(alert: Alert, now: float, repeat_interval: float) -> bool:
    """Prometheus' rule: never while pending; once when resolved; on firing and every repeat_interval."""
    if alert.state == State.PENDING:
        return False
    if alert.state == State.INACTIVE:
        return alert.resolved_at is not None and (alert.last_sent_at is None or alert.resolved_at > alert.last_sent_at)
    return alert.last_sent_at is None or alert.last_sent_at + repeat_interval <= now
