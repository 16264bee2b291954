"""Three real `specwatch collector serve` processes on one PostgreSQL; the leader is SIGKILLed mid-run.

The replicas start together against an empty database (their migrations take turns under the
advisory lock). Producers spread batches over them while an alert rule (`for: 0s`) watches the
stored acceptance: bad records make it fire, the leader is killed, a follower takes over, good
records make it resolve. A batch that fails (the killed replica) is resent to the next replica,
as the engine's telemetry client does. Then:
  * every acknowledged record is stored exactly once (by request_id), nothing else is stored;
  * the webhook receiver got exactly one "firing" and one "resolved" notification for the alert's
    fingerprint (the new leader read the alert state from the store: no re-fire, no second "firing";
    a redelivery of the same notification, same Idempotency-Key, is the outbox's at-least-once);
  * /readyz named the new leader within two alert cycles of the kill;
  * the roll-ups count every stored request once, across the takeover.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
from collector_payloads import request_dict
from sqlalchemy import text
from waiting import wait_for
from webhook_receiver import Receiver

from specwatch.collector.db import make_db
from specwatch.common.procs import child_env, free_port, specwatch_command

POSTGRES_URL = os.environ.get("SPECWATCH_TEST_POSTGRES_URL")
pytestmark = pytest.mark.skipif(
    not POSTGRES_URL,
    reason="PostgreSQL server binaries not found: apt-get install postgresql (or set SPECWATCH_TEST_POSTGRES_URL)",
)
REPLICAS = 3
ALERT_INTERVAL_S = 2.0
BATCH = 20
RULES = f"""
evaluation:
  interval: {ALERT_INTERVAL_S:g}s
  repeat_interval: 1h
  resolved_retention: 5m
rules:
  - name: SpecAcceptanceLow
    signal: acceptance_rate
    op: "<"
    threshold: 0.6
    window: 5m
    for: 0s
    min_samples: 5
    group_by: [instance]
    summary: "acceptance {{{{ $value }}}} on {{{{ $labels.instance }}}}"
receivers:
  - name: ops
    url: http://127.0.0.1:{{port}}/hook
    retry_backoff: 0.5s
"""


class Replica:
    def __init__(self, index: int, tmp_path: Path, rules: Path) -> None:
        self.port, self.name = free_port(), f"replica-{index}"
        self.url = f"http://127.0.0.1:{self.port}"
        env = {
            "SPECWATCH_DATABASE_URL": POSTGRES_URL,
            "SPECWATCH_ALERT_RULES": str(rules),
            "SPECWATCH_REPLICA_ID": self.name,
            "SPECWATCH_LEADER_RETRY_S": "0.5",
            "SPECWATCH_MAINTENANCE_INTERVAL_S": "1",
            "SPECWATCH_INGEST_PROCESSES": "0",  # threads: three replicas share two cores here
        }
        self.log = tmp_path / f"{self.name}.log"
        with self.log.open("wb") as out:
            self.process = subprocess.Popen(
                specwatch_command("collector", "serve", "--port", str(self.port)),
                env=child_env(env),
                stdout=out,
                stderr=subprocess.STDOUT,
            )

    def readiness(self) -> dict | None:
        try:
            response = httpx.get(f"{self.url}/readyz", timeout=2)
        except httpx.HTTPError:
            return None
        return response.json() if response.status_code == 200 else None

    def alive(self) -> bool:
        return self.process.poll() is None


class Producers:
    """Threads posting batches of `BATCH` records round-robin over the live replicas; a failed batch
    is resent to the next replica. `bad` chooses the records' acceptance (2 or 15 of 16 tokens)."""

    def __init__(self, replicas: list[Replica], threads: int = 2) -> None:
        self.replicas, self.bad, self.stop = replicas, True, threading.Event()
        self.acknowledged: list[str] = []
        self.failures = 0
        self._ids = itertools.count()
        self._lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run, args=(k,), daemon=True) for k in range(threads)]
        for thread in self.threads:
            thread.start()

    def _run(self, k: int) -> None:
        targets = itertools.cycle(self.replicas[k:] + self.replicas[:k])
        with httpx.Client(timeout=10) as http:
            while not self.stop.is_set():
                batch = self._batch()
                while not self._post(http, next(targets), batch) and not self.stop.is_set():
                    with self._lock:
                        self.failures += 1
                time.sleep(0.05)

    def _batch(self) -> list[dict]:
        accepted = 2 if self.bad else 15
        per_position = [sum(1 for d in range(4) if min(4, max(0, accepted - 4 * d)) > k) for k in range(4)]
        with self._lock:
            ids = [next(self._ids) for _ in range(BATCH)]
        now = time.time()
        return [
            request_dict(
                i,
                request_id=f"replicas-{i}",
                started_at=now - 0.5,
                num_drafts=4,
                num_draft_tokens=16,
                num_accepted_tokens=accepted,
                accepted_per_position=per_position,
            )
            for i in ids
        ]

    def _post(self, http: httpx.Client, replica: Replica, batch: list[dict]) -> bool:
        try:
            response = http.post(f"{replica.url}/v1/ingest", json={"requests": batch})
        except httpx.HTTPError:
            return False
        if response.status_code != 200:
            return False
        with self._lock:
            self.acknowledged += [record["request_id"] for record in batch]
        return True

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)


def leaders(replicas: list[Replica]) -> list[str]:
    return [r.name for r in replicas if r.alive() and (r.readiness() or {}).get("leader")]


def deliveries(receiver: Receiver) -> list[tuple[str, str]]:
    """(fingerprint, status) of every alert in every notification the receiver got. Delivery is at
    least once: a leader killed between its POST and recording it leaves the row for the next leader,
    which posts it again with the same Idempotency-Key (counted once here, as a receiver dedupes)."""
    notifications = {headers["Idempotency-Key"]: json.loads(body) for headers, body in receiver.received}
    return [(alert["fingerprint"], alert["status"]) for body in notifications.values() for alert in body["alerts"]]


def test_replicas_survive_the_leader_being_killed(empty_postgres, tmp_path):
    hook_port = free_port()
    receiver = Receiver(hook_port)
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES.format(port=hook_port))
    replicas = [Replica(i, tmp_path, rules) for i in range(REPLICAS)]  # all at once, on an empty database
    producers = None
    try:
        wait_for(lambda: all(r.readiness() for r in replicas), lambda: _logs(replicas), timeout=60, interval=0.2)
        (first,) = wait_for(lambda: leaders(replicas), "a leader", timeout=10)
        producers = Producers(replicas)
        wait_for(lambda: "firing" in {s for _, s in deliveries(receiver)}, "the alert to fire", timeout=20)

        old = next(r for r in replicas if r.name == first)
        old.process.send_signal(signal.SIGKILL)
        killed_at = time.monotonic()
        old.process.wait(10)
        (second,) = wait_for(lambda: leaders(replicas), "a new leader", timeout=20, interval=0.05)
        takeover_s = time.monotonic() - killed_at
        assert second != first
        assert takeover_s < 2 * ALERT_INTERVAL_S, f"the new leader showed after {takeover_s:.1f} s"

        producers.bad = False  # good acceptance from now on: the alert resolves
        wait_for(lambda: "resolved" in {s for _, s in deliveries(receiver)}, "the alert to resolve", timeout=30)
        time.sleep(2 * ALERT_INTERVAL_S)  # two more cycles: nothing else may be sent
        producers.finish()
        time.sleep(2 * ALERT_INTERVAL_S)
        new_leader = next(r for r in replicas if r.name == second)
        metrics = httpx.get(f"{new_leader.url}/metrics").text
        assert "specwatch_collector_leader 1.0" in metrics
        follower = next(r for r in replicas if r.alive() and r.name != second)
        assert "specwatch_collector_leader 0.0" in httpx.get(f"{follower.url}/metrics").text
    finally:
        if producers is not None:
            producers.finish()
        for replica in replicas:
            if replica.alive():
                replica.process.terminate()
        for replica in replicas:
            replica.process.wait(30)
        receiver.close()

    sent = Counter(deliveries(receiver))
    assert len({fingerprint for fingerprint, _ in sent}) == 1, sent
    assert sorted(sent.values()) == [1, 1] and {s for _, s in sent} == {"firing", "resolved"}, sent
    assert producers.failures > 0  # some batches did hit the killed replica and were resent
    _check_stored_once(producers.acknowledged)
    print(
        f"\n{len(producers.acknowledged)} records acknowledged, {producers.failures} batches resent; "
        f"new leader in /readyz {takeover_s:.2f} s after the kill"
    )


def _check_stored_once(acknowledged: list[str]) -> None:
    assert len(acknowledged) == len(set(acknowledged))
    db = make_db(POSTGRES_URL)
    try:
        with db.connect() as conn:
            stored = Counter(conn.scalars(text("SELECT request_id FROM requests")))
            rolled_up = conn.scalar(text("SELECT sum(requests) FROM request_rollups"))
    finally:
        db.dispose()
    assert set(stored) == set(acknowledged) and max(stored.values()) == 1
    # the survivors' leader rolled up the rest after the kill; every request counted once
    assert rolled_up == len(acknowledged), (rolled_up, len(acknowledged))


def _logs(replicas: list[Replica]) -> str:
    return "replicas to start; logs:\n" + "\n".join(f"{r.name}: {r.log.read_text()[-1500:]}" for r in replicas)
