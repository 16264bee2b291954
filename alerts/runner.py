"""The alert runner: every `evaluation.interval`, evaluate every rule, persist, notify, remediate.

First the change detectors' pass (`alerts.baselines`, `alerts.regression`) updates their rows and the
anomaly pass (`alerts.anomaly_pass`) flags new requests. Per
rule, in one transaction: the rule's new alert states, its transitions, its health (time
taken, error) and the outbox rows of what needs sending. A rule whose signal fails records
its error and the others keep going; the rules of one cycle share the store reads they have
in common (`StoreSignals.cycle`). Remediation runs after the commit, for alerts that
started firing; an alert that fell back to plain decoding restores speculation when it
resolves, unless another firing alert still wants that instance on plain decoding.
Notifications are posted by a separate, faster loop (`deliver`), so a slow receiver never
delays evaluation. Runs inside the collector (`service.app`) or as `specwatch alerts run`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass, field, replace
from functools import partial

import httpx
from sqlalchemy import Engine

from specwatch.alerts import anomaly_pass, baselines, canary, notify, regression, retrain
from specwatch.alerts.actions import ActionResult, Remediator
from specwatch.alerts.evaluator import Alert, State, Transition, evaluate, needs_sending
from specwatch.alerts.rules import AlertConfig, Rule
from specwatch.alerts.signals import StoreSignals
from specwatch.alerts.store import load_alerts, save_rule
from specwatch.collector.db import write_transaction
from specwatch.collector.maintenance import in_turn

log = logging.getLogger("specwatch.alerts")
FALLBACK = "fallback_autoregressive"
DELIVERY_INTERVAL_S = 1.0


@dataclass
class CycleReport:
    at: float
    duration_s: float = 0.0
    transitions: list[Transition] = field(default_factory=list)
    notifications: int = 0
    actions: list[ActionResult] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)


class AlertRunner:
    def __init__(
        self, db: Engine, config: AlertConfig, source=None, external_url: str = "", http: httpx.Client | None = None
    ) -> None:
        self.db, self.config = db, config
        self.source = source or StoreSignals(db)
        self.external_url = external_url
        self.http = http or httpx.Client()
        self.remediator = Remediator(db, config.remediation, self.http)

    def cycle(self, now: float | None = None) -> CycleReport:
        """Evaluate every rule once at `now`."""
        now = time.time() if now is None else now
        report, started = CycleReport(now), time.perf_counter()
        self._detect(now, report)
        stored = load_alerts(self.db)
        source = self.source.cycle(now) if isinstance(self.source, StoreSignals) else self.source
        current: dict[str, dict[str, Alert]] = {}
        for rule in self.config.rules:
            current[rule.name] = self._evaluate_rule(source, rule, stored.get(rule.name, {}), now, report)
        self._remediate(report, current, now)
        report.duration_s = time.perf_counter() - started
        return report

    def _detect(self, now: float, report: CycleReport) -> None:
        """The change detectors' pass: drift baselines, regressions at deploy markers (their rows feed
        the acceptance_drift and acceptance_regression signals)."""
        settings = self.config.detectors
        passes = {
            "drift": lambda: baselines.run_pass(self.db, settings.drift, now),
            "regression": lambda: regression.run_pass(self.db, settings.regression, now),
            "anomalies": lambda: anomaly_pass.run_pass(self.db, settings, now),
            "canary": lambda: canary.run_pass(self.db, self.config, now, self.external_url),
        }
        for name, run in passes.items():
            try:
                run()
            except Exception as exc:  # noqa: BLE001 - a failed detector must not stop the rules
                log.warning("detector %s failed: %s", name, exc)
                report.errors[f"detector:{name}"] = f"{type(exc).__name__}: {exc}"

    def _evaluate_rule(
        self, source, rule: Rule, previous: dict[str, Alert], now: float, report: CycleReport
    ) -> dict[str, Alert]:
        started = time.perf_counter()
        try:
            samples = source.query(rule.signal, rule.window, rule.group_by, now)
        except Exception as exc:  # noqa: BLE001 - one broken signal must not stop the other rules
            log.warning("alert rule %s: signal %s failed: %s", rule.name, rule.signal, exc)
            samples = exc
        outcome = evaluate(now, rule, samples, previous, self.config.evaluation.resolved_retention)
        if retrain.ACTION in rule.actions:  # name the capture and the commands that retrain from it
            hinted = retrain.with_retrain_hints(outcome.alerts, self.external_url, self.config.detectors.drift.tag_keys)
            outcome = replace(outcome, alerts=hinted)
        due = [a for a in outcome.alerts.values() if needs_sending(a, now, self.config.evaluation.repeat_interval)]
        alerts = {**outcome.alerts, **{a.fingerprint: replace(a, last_sent_at=now) for a in due}}
        with write_transaction(self.db) as conn:
            save_rule(conn, rule.name, alerts, outcome.transitions, now, time.perf_counter() - started, outcome.error)
            if due:
                report.notifications += notify.enqueue(conn, self.config, rule.name, due, now, self.external_url)
        report.transitions += outcome.transitions
        if outcome.error:
            report.errors[rule.name] = outcome.error
        return alerts

    def _remediate(self, report: CycleReport, current: dict[str, dict[str, Alert]], now: float) -> None:
        restore: dict[str | None, Alert] = {}
        for t in report.transitions:
            rule = self.config.rule(t.rule)
            alert = current[t.rule].get(t.fingerprint)
            if t.to_state == State.FIRING and alert is not None:
                report.actions += [self.remediator.run(action, alert, now) for action in rule.actions]
            elif t.from_state == State.FIRING and FALLBACK in rule.actions and alert is not None:
                restore[alert.labels.get("instance")] = alert
        for instance, alert in restore.items():
            if not self._fallback_still_wanted(current, instance):
                report.actions.append(self.remediator.run("restore_speculative", alert, now))

    def _fallback_still_wanted(self, current: dict[str, dict[str, Alert]], instance: str | None) -> bool:
        return any(
            a.state == State.FIRING
            and a.labels.get("instance") == instance
            and FALLBACK in self.config.rule(name).actions
            for name, alerts in current.items()
            for a in alerts.values()
        )

    def deliver(self, now: float | None = None) -> int:
        return notify.deliver_due(self.db, self.config, self.http, now)

    async def run(self, turn: threading.Lock | None = None) -> None:
        """Evaluate and deliver forever (cancel the task to stop). `turn`: held by each evaluation, as by
        the leader's other background passes (collector.maintenance.in_turn says why)."""
        await asyncio.gather(
            self._loop(partial(in_turn, turn, self._cycle_logged), self.config.evaluation.interval),
            self._loop(self.deliver, DELIVERY_INTERVAL_S),
        )

    def _cycle_logged(self) -> None:
        report = self.cycle()
        for t in report.transitions:
            log.info("alert %s %s: %s -> %s (value %.3g)", t.rule, t.labels, t.from_state, t.to_state, t.value)

    @staticmethod
    async def _loop(step, interval_s: float) -> None:
        while True:
            try:
                await asyncio.to_thread(step)
            except Exception:  # noqa: BLE001 - keep evaluating; the database may be back next time
                log.exception("alert runner step failed")
            await asyncio.sleep(interval_s)

    def close(self) -> None:
        self.http.close()
