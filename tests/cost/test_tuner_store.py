"""The tuner from stored records: alone (level 1: flat cost, high acceptance) speculation pays at the
largest k measured; 8 at a time (steep cost, low acceptance) plain wins; other levels keep today's k.
Through the store (both dialects), `specwatch tune recommend` and GET /v1/tune."""

from __future__ import annotations

import json

import pytest
from collector_payloads import T0, event_dict
from tuning_payloads import records, spec

from specwatch.cli import main
from specwatch.collector.ingest.store import Store
from specwatch.collector.reads.queries import Window
from specwatch.collector.reads.tuning_reads import tuning_rows
from specwatch.cost.tuner import TuneRules
from specwatch.cost.tuner_data import recommend, recommend_from_store
from specwatch.cost.tuner_emit import plan_json
from specwatch.telemetry.schema import IngestBatch

WINDOW = Window(T0 - 10, T0 + 5000)
RULES = TuneRules(max_batch=16)


def fill(db, events=()) -> None:
    Store(db).insert(IngestBatch.model_validate({"requests": records(), "events": list(events)}))


def test_recommend_from_records(db):
    fill(db, [event_dict(0, at=T0 - 5, kind="config", detail={"version": "0.32.0"})])
    plan = recommend_from_store(db, WINDOW, rules=RULES)
    by_level = {b.level: b for b in plan.buckets}
    one, eight = by_level[1], by_level[8]
    assert plan.today_k == 4 and plan.drafter == "ngram" and plan.upstream_version == "0.32.0" and not plan.stale
    assert (one.k, one.enough) == (4, True) and one.reason == "most tokens/s"
    assert one.acceptance == pytest.approx((13.5 / 16, 12 / 16, 10 / 16, 8 / 16), rel=0.01)
    assert one.cost_source == "records: decode wall time (e2e - ttft)"
    assert one.predicted(0) == pytest.approx(1 / 0.040, rel=1e-6)  # plain: 64 steps in 2.56 s
    assert one.predicted(4) == pytest.approx((1 + sum(one.acceptance)) / 0.044, rel=1e-3)
    assert one.low[4] <= one.predicted(4) <= one.high[4] and one.low[4] > one.predicted(0)
    assert (eight.k, eight.enough) == (0, True) and eight.reason.startswith("plain")
    assert eight.predicted(0) == pytest.approx(8 / 0.05, rel=1e-6) and eight.gain > 1
    assert not by_level[2].enough and by_level[2].k == 4 and "not enough data" in by_level[2].reason
    assert plan.ranges == ((1, 5, 4), (6, 11, 0), (12, 16, 4))


def test_a_newer_upstream_version_marks_it_stale(db):
    events = [event_dict(0, at=T0 - 5, kind="config", detail={"version": "0.32.0"})]
    events.append(event_dict(1, at=T0 + 4000, kind="config", detail={"version": "0.33.0"}))
    fill(db, events)
    plan = recommend_from_store(db, WINDOW, rules=RULES)
    assert plan.stale and plan.upstream_version == "0.32.0" and "now runs 0.33.0" in plan.stale_reason


def test_profile_and_current_k(db):
    fill(db)
    flat = {lv: {"0": 0.04, "4": 0.04} for lv in (1, 2, 4, 8)}
    from specwatch.cost.tuner_data import profile_curves

    plan = recommend(tuning_rows(db, WINDOW), rules=RULES, current_k=2, profile=profile_curves({"levels": flat}))
    eight = next(b for b in plan.buckets if b.level == 8)
    # positions 2 and 3 are never accepted there: k = 2 makes as much as 3 or 4, and the smallest wins ties
    assert eight.k == 2 and eight.today_k == 2 and eight.cost_source == "profile: given"
    with pytest.raises(ValueError, match="profile level"):
        profile_curves({"levels": {"x": {"0": 1}}})


def test_cli_text_json_and_bad_input(db_url, db, tmp_path, capsys):
    fill(db)
    window = ["--start", str(WINDOW.start), "--end", str(WINDOW.end), "--max-batch", "16"]
    assert main(["tune", "recommend", "--db", db_url, *window, "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert found["ranges"] == [[1, 5, 4], [6, 11, 0], [12, 16, 4]]
    assert found["vllm_speculative_config"]["num_speculative_tokens_per_batch_size"] == found["ranges"]
    assert found["trtllm_draft_len_schedule"] == "{5: 4, 11: 0, 16: 4}"
    assert main(["tune", "recommend", "--db", db_url, *window]) == 0
    text = capsys.readouterr().out
    assert '--speculative-config \'{"method": "ngram"' in text and "not enough data" in text
    bad_profile = tmp_path / "p.json"
    bad_profile.write_text("{}")
    assert main(["tune", "recommend", "--db", db_url, "--profile", str(bad_profile)]) == 2
    assert "--profile" in capsys.readouterr().err
    assert main(["tune", "recommend", "--db", db_url, "--start", "5"]) == 2
    with pytest.raises(SystemExit) as exit_:
        main(["tune", "recommend", "--max-k", "x"])
    assert exit_.value.code == 2


def test_tune_endpoint(client):
    assert client.post("/v1/ingest", json={"requests": records()}).status_code == 200
    window = {"start": WINDOW.start, "end": WINDOW.end, "max_batch": 16}
    got = client.get("/v1/tune", params=window).json()
    assert got["ranges"] == [[1, 5, 4], [6, 11, 0], [12, 16, 4]] and got["today_k"] == 4
    assert got["buckets"][0]["tokens_per_s"][0] == pytest.approx(25.0)
    assert client.get("/v1/tune", params={**window, "current_k": 2}).json()["buckets"][2]["today_k"] == 2
    assert client.get("/v1/tune", params={**window, "max_k": -1}).status_code == 422
    assert client.get("/v1/tune", params={"start": 5}).status_code == 422


def test_todays_config_as_a_schedule(db_url, db, client, capsys):
    fill(db)
    config = json.dumps({"num_speculative_tokens": 4, "num_speculative_tokens_per_batch_size": [[1, 5, 2], [6, 16, 4]]})
    window = ["--start", str(WINDOW.start), "--end", str(WINDOW.end), "--max-batch", "16"]
    assert main(["tune", "recommend", "--db", db_url, *window, "--current-config", config, "--json"]) == 0
    found = json.loads(capsys.readouterr().out)
    assert [b["today_k"] for b in found["buckets"]] == [2, 2, 2, 4, 4]
    one = found["buckets"][0]
    assert one["gain"] == pytest.approx(one["tokens_per_s"][4] / one["tokens_per_s"][2])
    assert main(["tune", "recommend", "--db", db_url, "--current-config", "{"]) == 2
    assert "--current-config" in capsys.readouterr().err
    assert main(["tune", "recommend", "--db", db_url, "--current-config", config, "--current-k", "3"]) == 2
    params = {"start": WINDOW.start, "end": WINDOW.end, "max_batch": 16, "current_config": "[1]"}
    bad = client.get("/v1/tune", params=params)
    assert bad.status_code == 422 and "current_config" in bad.text


def test_per_position_acceptance_divides_by_the_drafts_that_reached_each_position(db):
    """Drafts of varying length (vLLM `detailed`: a schedule, drafts cut near max_tokens): 16 drafts reached
    position 0, 12 position 1, 8 and 4 the others; half of each was accepted there. Taken to reach gamma,
    the later positions would read 6/16, 4/16, 2/16."""
    counted = []
    for i in range(25):
        record = spec(i, T0 + 10 * i, [8, 6, 4, 2], 16, 0.044)
        counted.append(record | {"num_draft_tokens": 40, "drafts_per_position": [16, 12, 8, 4]})
    summary = [spec(100 + i, T0 + 5 + 10 * i, [8, 6, 4, 2], 16, 0.044) for i in range(25)]
    Store(db).insert(IngestBatch.model_validate({"requests": counted}))
    plan = recommend_from_store(db, WINDOW, rules=RULES)
    one = next(b for b in plan.buckets if b.level == 1)
    assert one.acceptance == pytest.approx((0.5, 0.5, 0.5, 0.5))
    assert "counted per step" in one.acceptance_source and "for" not in one.acceptance_source
    assert plan.notes == ()
    Store(db).insert(IngestBatch.model_validate({"requests": summary}))
    mixed = recommend_from_store(db, WINDOW, rules=RULES)
    one = next(b for b in mixed.buckets if b.level == 1)
    assert one.acceptance == pytest.approx((16 / 32, 12 / 28, 8 / 24, 4 / 20))
    assert (
        "for 25 of 50 requests" in one.acceptance_source and "every draft taken to reach gamma" in one.acceptance_source
    )
    assert len(mixed.notes) == 1 and "detailed" in mixed.notes[0]


def test_data_parallel_upstream_gets_static_k_and_the_reason(db):
    """An upstream whose /metrics reports two `engine` ranks (the gateway's marker): vLLM would drop a
    per-batch-size schedule, so the tuner emits today's k for every batch size, without the schedule key."""
    marker = {"version": "0.32.0", "num_speculative_tokens": 4, "data_parallel_ranks": 2, "role": "upstream"}
    fill(db, [event_dict(0, at=T0 - 5, kind="config", detail=marker)])
    plan = recommend_from_store(db, WINDOW, rules=RULES)
    assert plan.static and plan.ranges == ((1, 16, 4),)
    note = plan.notes[-1]
    assert note.startswith("data-parallel size 2 > 1: vLLM drops num_speculative_tokens_per_batch_size")
    assert "[1, 5, 4], [6, 11, 0], [12, 16, 4]" in note  # what it would have scheduled
    emitted = plan_json(plan)["vllm_speculative_config"]
    assert emitted["num_speculative_tokens"] == 4 and "num_speculative_tokens_per_batch_size" not in emitted
    single = {**marker, "data_parallel_ranks": 1}
    fill(db, [event_dict(1, at=T0 - 4, kind="config", detail=single)])  # the latest marker counts
    assert not recommend_from_store(db, WINDOW, rules=RULES).static
