"""`specwatch tune profile` against real servers: the bundled engine over HTTP, once plain (k = 0) and once
with n-gram drafting, profiled at concurrency 1 and 2; the profile it writes is what `specwatch tune
recommend --profile` reads (step costs and acceptance from the profile, dated, no records needed).
Bad arguments and an unreachable server exit 2."""

from __future__ import annotations

import json

import pytest
from engine_harness import spec_and_plain

from specwatch.cli import main
from specwatch.common.procs import free_port
from specwatch.cost.tuner_data import read_profile

PROFILE = ["--concurrency", "1,2", "--requests", "4", "--max-tokens", "10"]


@pytest.fixture(scope="module")
def upstreams(bundled_engine):
    """(n-gram engine, plain engine) over the one bundled model."""
    with spec_and_plain(bundled_engine) as pair:
        yield pair


@pytest.fixture(scope="module")
def profiled(upstreams, tmp_path_factory) -> tuple[dict, object, str]:
    """(the profile JSON, its path, what the command printed) of one sweep over both engines."""
    spec, plain = upstreams
    out = tmp_path_factory.mktemp("profile") / "profile.json"
    args = ["tune", "profile", "--upstream", spec.url, "--upstream", plain.url, *PROFILE, "--out", str(out)]
    assert main(args) == 0
    return json.loads(out.read_text()), out, spec.records


def test_the_profile_has_each_servers_k_step_costs_and_acceptance(profiled, upstreams):
    found, _, _ = profiled
    spec, plain = upstreams
    ks = {u["url"]: u["k"] for u in found["upstreams"]}
    assert ks[plain.url] == 0 and ks[spec.url] > 0
    assert set(found["levels"]) == {"1", "2"}
    for level in ("1", "2"):
        assert set(found["levels"][level]) == {"0", str(ks[spec.url])}
        assert all(0 < s < 10 for s in found["levels"][level].values())
        entry = found["acceptance"][level]
        assert 0 < entry["requests"] <= 4 and entry["drafts"] > 0 and 0 < entry["draft_rate"] <= 1
        assert all(0 <= a <= 1 for a in entry["rates"])
    rows = found["measured"]
    assert len(rows) == 4 and all(r["requests"] == 4 and r["tokens_per_s"] > 0 for r in rows)
    assert found["made_at"] > 0 and found["upstream_version"] is None  # the engine has no /version
    assert all(r["draft_tokens_per_step"] == 0 for r in rows if r["k"] == 0)


def test_the_step_cost_is_the_engines_own_timing(profiled, upstreams):
    """Σ generation time / Σ steps of the spec engine's own records at concurrency 1 (warm-up excluded)."""
    found, _, records = profiled
    spec, _ = upstreams
    k = next(u["k"] for u in found["upstreams"] if u["url"] == spec.url)
    alone = records[1:5]  # after the warm-up: the 4 requests at concurrency 1 (the spec engine goes first)
    steps = sum(r.output_tokens - 1 - r.num_accepted_tokens for r in alone)
    seconds = sum(r.e2e_s - r.ttft_s for r in alone)
    assert found["levels"]["1"][str(k)] == pytest.approx(seconds / steps, rel=0.02)


def test_recommend_reads_the_profile(profiled, tmp_path, capsys):
    found, path, _ = profiled
    db = f"sqlite:///{tmp_path / 'empty.db'}"
    assert main(["db", "upgrade", "--db", db]) == 0
    capsys.readouterr()
    rules = ["--max-batch", "2", "--min-requests", "1", "--min-drafts", "1", "--current-k", "8"]
    assert main(["tune", "recommend", "--db", db, "--profile", str(path), *rules, "--json"]) == 0
    plan = json.loads(capsys.readouterr().out)
    assert [b["level"] for b in plan["buckets"]] == [1, 2]
    for bucket in plan["buckets"]:
        assert bucket["enough"] and bucket["cost_source"].startswith("profile: specwatch tune profile")
        assert bucket["acceptance_source"].startswith("profile: ")
        model_best = bucket["tokens_per_s"][bucket["k"]] == max(bucket["tokens_per_s"])
        assert model_best or bucket["reason"].startswith("plain: measured end to end"), bucket
    assert plan["made_at"] == pytest.approx(found["made_at"])
    profile = read_profile(found)
    assert profile.acceptance[1].requests == found["acceptance"]["1"]["requests"]
    measured = {(row["level"], row["k"]): row["tokens_per_s"] for row in found["measured"]}
    assert {(lv, k): tps for lv, ks in profile.measured.items() for k, tps in ks.items()} == measured


def test_bad_arguments_and_an_unreachable_server_exit_2(tmp_path, capsys):
    down = f"http://127.0.0.1:{free_port()}"
    assert main(["tune", "profile", "--upstream", down, "--out", str(tmp_path / "p.json")]) == 2
    assert "cannot read its /v1/models" in capsys.readouterr().err and not (tmp_path / "p.json").exists()
    for bad in (["--concurrency", "0"], ["--concurrency", "3,4"], ["--requests", "x"], []):
        with pytest.raises(SystemExit) as exit_:
            main(["tune", "profile", *(["--upstream", down] if bad else []), *bad])
        assert exit_.value.code == 2
    assert "same batch-size bucket" in capsys.readouterr().err
    assert main(["tune", "profile", "--upstream", down, "--upstream", down + "/"]) == 2
    malformed = {"levels": {"1": {"0": 0.01}}, "acceptance": {"1": {"rates": [2.0]}}}
    with pytest.raises(ValueError, match="profile acceptance"):
        read_profile(malformed)
    with pytest.raises(ValueError, match='profile "measured" row'):
        read_profile({"levels": {"1": {"0": 0.01}}, "measured": [{"level": "one", "k": 0, "tokens_per_s": 3.0}]})
    with pytest.raises(SystemExit) as exit_:
        main(["tune", "recommend", "--min-gain", "1.5"])
    assert exit_.value.code == 2 and "want a share from 0 to 1" in capsys.readouterr().err


def test_passes_split_the_requests_and_tokens_per_s_counts_only_each_servers_own_passes():
    from specwatch.tune_measure import Answer, measured_rows
    from specwatch.tune_profile import passes

    assert passes(16, 2) == [range(0, 8), range(8, 16)] and passes(1, 3) == [range(0, 1)]
    # two passes of 1 s each, 10 s apart (another server ran between them): 20 tokens in 2 s, not 11 s
    answers = [Answer("u", 1, 0, at, 1.0, 10, 0.9, None, part) for part, at in enumerate((100.0, 110.0))]
    (row,) = measured_rows(answers, {"u": 0})
    assert row["tokens_per_s"] == pytest.approx(10.0) and row["ms_per_token"] == pytest.approx(100.0)
    assert row["seconds_per_step"] == pytest.approx(1.8 / 18)
