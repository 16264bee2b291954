"""Issue 56: an acceptance alert on a drafter names the capture slice and the commands that retrain from it,
in its annotations and its webhook; the named export command, run as written, exports exactly that slice."""

from __future__ import annotations

import shlex
import time

import httpx
import orjson
from collector_payloads import request_dict
from rule_dicts import acceptance_rule
from sqlalchemy import select
from thread_server import ThreadServer

from specwatch.alerts.retrain import retrain_annotations
from specwatch.alerts.rules import parse_config
from specwatch.alerts.runner import AlertRunner
from specwatch.alerts.tables import alert_notifications
from specwatch.cli import main
from specwatch.collector.db import make_db
from specwatch.collector.settings import Settings
from specwatch.service.app import create_app

KEYS = ("scenario", "tenant")


def test_the_hint_names_the_slice_and_quotes_what_producers_sent():
    hints = retrain_annotations({"drafter": "model:x;rm -rf ~<b>", "model": "m", "tag": "chat"}, "http://c:8087", KEYS)
    assert hints["capture"].startswith("drafter=model:x;rm -rf ~&lt;b&gt; model=m tag=chat")
    assert "--drafter 'model:x;rm -rf ~&lt;b&gt;'" in hints["retrain_export"]  # one shell word, inert markup
    assert "--series-tag chat --tag-keys scenario,tenant" in hints["retrain_export"]
    assert hints["capture_url"].startswith("http://c:8087/v1/captures?drafter=model%3Ax%3Brm")
    assert "scripts/prepare_data.py --model m --data capture-" in hints["retrain_prepare"]
    assert retrain_annotations({"drafter": "none", "model": "m"}, "", KEYS) == {}
    assert (
        "--collector $SPECWATCH_COLLECTOR_URL "
        in retrain_annotations({"drafter": "ngram", "model": "m"}, "", KEYS)["retrain_export"]
    )


def low_acceptance(i: int, now: float, drafter: str) -> dict:
    return request_dict(
        i,
        started_at=now - 60 + i,
        drafter=drafter,
        num_accepted_tokens=1,
        accepted_per_position=[1, 0, 0, 0],
        tags={"scenario": "chat", "tenant": "acme"},
    )


def capture(i: int, drafter: str, now: float) -> dict:
    return {
        "capture_id": f"req-{i}",
        "instance": "gpu-0",
        "model": "smollm2-135m",
        "drafter": drafter,
        "kind": "chat",
        "tags": {"scenario": "chat", "tenant": "acme"},
        "started_at": now - 60 + i,
        "prompt": [{"role": "user", "content": f"q{i}"}],
        "output": f"a{i}",
        "prompt_tokens": 3,
        "output_tokens": 2,
        "num_draft_tokens": 16,
        "num_accepted_tokens": 1,
        "expires_at": now + 3600,
    }


def test_a_firing_acceptance_alert_names_the_capture_and_its_command_runs(tmp_path, capsys):
    now = time.time()
    settings = Settings(
        data_dir=tmp_path, database_url=f"sqlite:///{tmp_path}/c.db", admin_token="adm", ingest_token="ing"
    )
    settings = Settings(**(settings.model_dump() | {"alerts_enabled": False, "ingest_processes": 0}))
    headers = {"content-type": "application/json", "authorization": "Bearer ing"}
    with ThreadServer(create_app(settings)) as collector:
        requests = [low_acceptance(i, now, "early-exit:4") for i in range(8)]
        captures = [capture(i, "early-exit:4", now) for i in range(8)] + [capture(9, "ngram", now)]
        assert httpx.post(f"{collector.url}/v1/ingest", json={"requests": requests}, headers=headers).status_code == 200
        assert (
            httpx.post(f"{collector.url}/v1/captures", json={"captures": captures}, headers=headers).status_code == 200
        )
        rule = acceptance_rule(group_by=["instance", "model", "drafter"], actions=["recommend_draft_retraining"])
        config = parse_config(
            {"rules": [rule | {"for": "0s"}], "receivers": [{"name": "ops", "url": "http://127.0.0.1:9/unused"}]}
        )
        db = make_db(settings.database_url_resolved)
        runner = AlertRunner(db, config, external_url=collector.url)
        try:
            runner.cycle(now)
            runner.cycle(now + 1)
        finally:
            runner.close()
        with db.connect() as conn:
            payloads = [
                orjson.loads(p) if isinstance(p, str | bytes) else p
                for (p,) in conn.execute(select(alert_notifications.c.payload))
            ]
        db.dispose()
        (alert,) = payloads[-1]["alerts"]
        assert alert["labels"]["drafter"] == "early-exit:4" and alert["status"] == "firing"
        annotations = alert["annotations"]
        assert annotations["capture"] == "drafter=early-exit:4 model=smollm2-135m"
        argv = shlex.split(annotations["retrain_export"].replace("capture-", str(tmp_path / "capture-")))
        assert argv[:4] == ["specwatch", "draft", "export", "--collector"] and argv[4] == collector.url
        assert main([*argv[1:], "--token", "adm"]) == 0  # the command as the webhook gives it
    out = next(tmp_path.glob("capture-*.jsonl"))
    exported = [orjson.loads(line) for line in out.read_bytes().splitlines()]
    assert sorted(r["id"] for r in exported) == [f"req-{i}" for i in range(8)]  # the drafter's, not n-gram's
    assert all(r["target_model"] == "smollm2-135m" for r in exported)
    assert "wrote 8 conversations" in capsys.readouterr().out
