"""Remediation: what a firing (or resolving) alert does to the engine, through its control API.

| action                     | engine call                                                         |
|----------------------------|---------------------------------------------------------------------|
| fallback_autoregressive    | POST /v1/control/mode {"mode": "autoregressive", "reason": "alert"} |
| restore_speculative        | POST /v1/control/mode {"mode": "auto", "reason": "alert"}           |
|                            | (sent when an alert that fell back resolves)                        |
| defragment                 | POST /v1/control/defragment                                         |
| unload_draft               | POST /v1/control/draft {"action": "unload"}                         |
| rebalance_streams          | POST /v1/control/streams {"target": "high", "draft": "low"}         |
|                            | (CUDA stream priorities)                                            |
| recommend_draft_retraining | recorded recommendation                                             |

The engine is found by the alert's `instance` label in the remediation config; the bearer
token comes from its `token_env`. The same (instance, action) is not repeated within the
cool-down. Every action is recorded in `alert_actions` with its outcome: `ok`, `failed`,
`cooldown`, `recommended`, `no_engine`, or `not_applicable` (the engine answered 409: the
action does not apply to it, e.g. stream priorities on a CPU engine; its message is kept).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import httpx
from sqlalchemy import Engine, func, insert, select

from specwatch.alerts.evaluator import Alert
from specwatch.alerts.rules import Remediation
from specwatch.alerts.tables import alert_actions
from specwatch.collector.db import write_transaction

ENGINE_CALLS: dict[str, tuple[str, dict | None]] = {
    "fallback_autoregressive": ("/v1/control/mode", {"mode": "autoregressive", "reason": "alert"}),
    "restore_speculative": ("/v1/control/mode", {"mode": "auto", "reason": "alert"}),
    "defragment": ("/v1/control/defragment", None),
    "unload_draft": ("/v1/control/draft", {"action": "unload"}),
    "rebalance_streams": ("/v1/control/streams", {"target": "high", "draft": "low"}),
}
RECOMMENDATIONS = {
    "recommend_draft_retraining": "retrain or replace the draft model on recent traffic (acceptance is low)",
}


@dataclass(frozen=True)
class ActionResult:
    action: str
    instance: str | None
    outcome: str
    detail: dict


class Remediator:
    def __init__(self, db: Engine, config: Remediation, http: httpx.Client) -> None:
        self.db, self.config, self.http = db, config, http

    def run(self, action: str, alert: Alert, now: float) -> ActionResult:
        """Carry out (or recommend, or skip in cool-down) one action for one alert, and record it."""
        instance = alert.labels.get("instance")
        if action in RECOMMENDATIONS:
            result = ActionResult(action, instance, "recommended", {"recommendation": RECOMMENDATIONS[action]})
        elif (last := self._last_done(action, instance)) is not None and now - last < self.config.cooldown:
            result = ActionResult(action, instance, "cooldown", {"last_at": last, "cooldown_s": self.config.cooldown})
        elif (url := self.config.engine_url(instance)) is None:
            result = ActionResult(
                action, instance, "no_engine", {"message": f"no engine control URL for instance {instance!r}"}
            )
        else:
            result = self._call(action, instance, url)
        with write_transaction(self.db) as conn:
            conn.execute(
                insert(alert_actions).values(at=now, rule=alert.rule, fingerprint=alert.fingerprint, **asdict(result))
            )
        return result

    def _last_done(self, action: str, instance: str | None) -> float | None:
        c = alert_actions.c
        stmt = select(func.max(c.at)).where(
            c.action == action, c.outcome == "ok", c.instance.is_(None) if instance is None else c.instance == instance
        )
        with self.db.connect() as conn:
            return conn.execute(stmt).scalar()

    def _call(self, action: str, instance: str | None, base_url: str) -> ActionResult:
        path, body = ENGINE_CALLS[action]
        token = self.config.token()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        url = base_url.rstrip("/") + path
        try:
            response = self.http.post(url, json=body or {}, headers=headers, timeout=self.config.timeout)
        except httpx.HTTPError as exc:
            return ActionResult(action, instance, "failed", {"url": url, "error": f"{type(exc).__name__}: {exc}"})
        detail = {"url": url, "status": response.status_code, "response": _json_or_text(response)}
        return ActionResult(action, instance, _outcome(response), detail)


def _outcome(response: httpx.Response) -> str:
    if response.is_success:
        return "ok"
    return "not_applicable" if response.status_code == 409 else "failed"


def _json_or_text(response: httpx.Response) -> object:
    try:
        return response.json()
    except ValueError:
        return response.text[:500]
