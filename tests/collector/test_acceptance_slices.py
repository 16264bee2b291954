"""GET /v1/acceptance/slices (issue 56): per drafter, tenant, scenario and prompt-length band, acceptance now
against the window before, the one-sided Mann-Whitney p-value and its Benjamini-Hochberg q-value (checked
against scipy on the same records), whether the slice lost acceptance, and its retrain candidate: the count of
the captures `specwatch draft export` would write for it (checked against GET /v1/captures with the same
slice), never their text. On SQLite and PostgreSQL (the `client` fixture)."""

from __future__ import annotations

import shlex
import time

import numpy as np
import pytest
from collector_payloads import T0, request_dict
from fastapi.testclient import TestClient
from scipy.stats import false_discovery_control, mannwhitneyu

from specwatch.collector.settings import Settings
from specwatch.service.app import create_app

NOW = {"start": T0, "end": T0 + 1000}  # the baseline: the 1000 s before
ACME = {"tenant": "acme", "scenario": "chat"}


def drafted(i: int, rate: float, start: float, prompt: int, tags: dict, drafter: str = "ngram") -> dict:
    accepted = int(round(rate * 16))
    per_position = [min(4, max(0, accepted - 4 * p)) for p in range(4)]
    per_position = sorted(per_position, reverse=True)
    return request_dict(
        i,
        started_at=start + 10 * (i % 90),
        drafter=drafter,
        prompt_tokens=prompt,
        num_draft_tokens=16,
        num_accepted_tokens=sum(per_position),
        accepted_per_position=per_position,
        tags=tags,
    )


def workload(rng: np.random.Generator) -> list[dict]:
    """acme/chat (30 tokens: band 0-64) falls from ~0.8 to ~0.3; the untagged slice (150 tokens: band
    128-256) holds at ~0.6; a third slice has too few requests to test."""
    records, i = [], 0
    for start, acme_rate in ((T0 - 1000, 0.8), (T0, 0.3)):
        for _ in range(30):
            records.append(drafted(i, float(np.clip(rng.normal(acme_rate, 0.1), 0, 1)), start, 30, ACME))
            records.append(drafted(i + 1, float(np.clip(rng.normal(0.6, 0.1), 0, 1)), start, 150, {}))
            i += 2
        for _ in range(3):
            records.append(drafted(i, 0.5, start, 600, {"tenant": "globex"}))
            i += 1
    return records


def capture(i: int, prompt_tokens: int, tags: dict, kind: str = "chat", expires_in: float = 3600, **extra) -> dict:
    now = time.time()
    return {
        "capture_id": f"cap-{i}",
        "instance": "gpu-0",
        "model": "smollm2-135m",
        "drafter": "ngram",
        "kind": kind,
        "tags": tags,
        "started_at": now - 10,
        "prompt": [{"role": "user", "content": f"question {i}"}],
        "output": f"answer {i}",
        "prompt_tokens": prompt_tokens,
        "output_tokens": 5,
        "num_draft_tokens": 16,
        "num_accepted_tokens": 4,
        "expires_at": now + expires_in,
        **extra,
    }


def captures() -> list[dict]:
    """16 exportable acme/chat captures in band 0-64; beside them, captures the export leaves out or that
    belong to other slices; 3 untagged ones in band 128-256."""
    found = [capture(i, 20 + i, ACME) for i in range(16)]
    found += [
        capture(100, 30, ACME, kind="completion"),  # no conversation: not exported
        capture(101, 30, ACME, output=""),  # no output: not exported
        capture(102, 64, ACME),  # band 64-128
        capture(103, 30, {"tenant": "acme"}),  # no scenario tag
        capture(104, 30, ACME, drafter="suffix"),
    ]
    return found + [capture(200 + i, 150, {}) for i in range(3)]


def post_all(client: TestClient, records: list[dict], stored: list[dict]) -> None:
    assert client.post("/v1/ingest", json={"requests": records}).status_code == 200
    answer = client.post("/v1/captures", json={"captures": stored})
    assert answer.status_code == 200 and answer.json()["stored"] == len(stored), answer.text


def expected_p(records: list[dict], prompt: int, tags: dict) -> tuple[float, float, int, int]:
    """scipy on the records themselves: (p, pooled acceptance before, now, and the request counts)."""

    def rates(lo: float) -> np.ndarray:
        return np.array(
            [
                r["num_accepted_tokens"] / 16
                for r in records
                if r["prompt_tokens"] == prompt and r["tags"] == tags and lo <= r["started_at"] < lo + 1000
            ]
        )

    now, before = rates(T0), rates(T0 - 1000)
    return float(mannwhitneyu(now, before, alternative="less").pvalue), before.mean(), now.mean(), len(now)


def test_the_slice_that_lost_acceptance_is_named_with_its_test_and_its_captures(client):
    records = workload(np.random.default_rng(7))
    post_all(client, records, captures())
    found = client.get("/v1/acceptance/slices", params=NOW)
    assert found.status_code == 200, found.text
    body = found.json()
    assert body["baseline"] == {"start": T0 - 1000, "end": T0}
    assert (body["tested"], body["untested"], body["lost"], body["truncated"]) == (2, 1, 1, False)
    lost, held = body["slices"]

    p_acme, before, now, n = expected_p(records, 30, ACME)
    p_none, *_ = expected_p(records, 150, {})
    q_acme, q_none = false_discovery_control([p_acme, p_none])
    assert (lost["tenant"], lost["scenario"], lost["prompt_tokens"], lost["lost"]) == ("acme", "chat", [0, 64], True)
    assert lost["p_value"] == pytest.approx(p_acme) and lost["q_value"] == pytest.approx(q_acme) and q_acme < 0.05
    assert lost["before"] == {"requests": n, "acceptance_rate": pytest.approx(before)}
    assert lost["now"] == {"requests": n, "acceptance_rate": pytest.approx(now)}
    assert (lost["captures"], lost["retrain_candidate"]) == (16, True)

    assert (held["tenant"], held["scenario"], held["prompt_tokens"], held["lost"]) == (None, None, [128, 256], False)
    assert held["p_value"] == pytest.approx(p_none) and held["q_value"] == pytest.approx(q_none)
    assert (held["captures"], held["retrain_candidate"]) == (3, False)
    assert "answer" not in found.text and "question" not in found.text  # counts only, never capture text


def test_each_export_command_reads_back_exactly_the_counted_captures(client):
    post_all(client, workload(np.random.default_rng(7)), captures())
    for found in client.get("/v1/acceptance/slices", params=NOW).json()["slices"]:
        argv = shlex.split(found["export_command"])
        assert argv[:5] == ["specwatch", "draft", "export", "--collector", "$SPECWATCH_COLLECTOR_URL"]
        flags = dict(zip(argv[5::2], argv[6::2]))
        params = {k[2:].replace("-", "_"): v for k, v in flags.items() if k[2:] not in ("target-model", "out")}
        page = client.get("/v1/captures", params=params).json()["captures"]
        exported = [c for c in page if c["kind"] == "chat" and c["output"]]
        assert len(exported) == found["captures"], (params, found)


def test_alpha_and_the_floors_change_the_verdicts(client):
    post_all(client, workload(np.random.default_rng(7)), captures())
    (q,) = [s["q_value"] for s in client.get("/v1/acceptance/slices", params=NOW).json()["slices"] if s["lost"]]
    stricter = client.get("/v1/acceptance/slices", params={**NOW, "alpha": q / 2}).json()
    assert (stricter["tested"], stricter["lost"]) == (2, 0)
    strict = client.get("/v1/acceptance/slices", params={**NOW, "min_captures": 17}).json()
    assert [s["retrain_candidate"] for s in strict["slices"]] == [False, False]
    floor = client.get("/v1/acceptance/slices", params={**NOW, "min_requests": 31}).json()
    assert (floor["tested"], floor["untested"], floor["slices"]) == (0, 3, [])
    short = client.get("/v1/acceptance/slices", params={**NOW, "baseline": 500, "limit": 1}).json()
    assert short["baseline"] == {"start": T0 - 500, "end": T0} and short["truncated"] is False
    assert short["tested"] == 0  # 15 requests a side in the last 500 s of the baseline: below the floor


def test_a_tenant_bound_read_token_sees_its_own_slices_only(settings, registry, tmp_path):
    (tmp_path / "tokens").write_text("read r-globex tenant=globex\nread r-all\ningest i-all\nadmin a-all\n")
    app = create_app(Settings(**(settings.model_dump() | {"tokens_file": tmp_path / "tokens"})), registry)
    with TestClient(app) as secured:
        headers = {"authorization": "Bearer i-all"}
        sent = secured.post("/v1/ingest", json={"requests": workload(np.random.default_rng(7))}, headers=headers)
        assert sent.status_code == 200, sent.text
        assert secured.get("/v1/acceptance/slices", params=NOW).status_code == 401
        mine = secured.get(
            "/v1/acceptance/slices", params={**NOW, "min_requests": 2}, headers={"authorization": "Bearer r-globex"}
        )
        assert mine.status_code == 200 and {s["tenant"] for s in mine.json()["slices"]} == {"globex"}
        everyone = secured.get(
            "/v1/acceptance/slices", params={**NOW, "min_requests": 2}, headers={"authorization": "Bearer r-all"}
        )
        assert {s["tenant"] for s in everyone.json()["slices"]} == {"acme", None, "globex"}


@pytest.mark.parametrize(
    "params, where",
    [
        ({"alpha": 0}, "alpha"),
        ({"alpha": 1}, "alpha"),
        ({"alpha": "nan"}, "alpha"),
        ({"min_requests": 1}, "min_requests"),
        ({"min_captures": 0}, "min_captures"),
        ({"baseline": -5}, "baseline"),
        ({"baseline": "inf"}, "baseline"),
        ({"limit": 0}, "limit"),
        ({"limit": "²"}, "limit"),
    ],
)
def test_bad_parameters_are_a_422_naming_them(client, params, where):
    answer = client.get("/v1/acceptance/slices", params={**NOW, **params})
    assert answer.status_code == 422
    (error,) = answer.json()["detail"]
    assert error["loc"] == ["query", where] and error["msg"]


def test_a_half_given_window_is_a_422_with_a_message(client):
    answer = client.get("/v1/acceptance/slices", params={"start": T0})
    assert answer.status_code == 422 and "give both start and end" in answer.json()["detail"]["message"]


def test_an_export_command_keeps_a_hostile_label_one_inert_argument():
    from specwatch.alerts.retrain import slice_export

    drafter = "model:x; rm -rf ~ $(id) `id`"
    command = slice_export("http://c:8087/", drafter, "m", "<b>acme</b>", None, (4096, None))
    argv = shlex.split(command)
    assert argv[argv.index("--drafter") + 1] == drafter and argv[argv.index("--tenant") + 1] == "<b>acme</b>"
    assert argv[argv.index("--scenario") + 1] == "none" and argv[argv.index("--collector") + 1] == "http://c:8087"
    assert argv[argv.index("--prompt-tokens") + 1] == "4096-999999999"
