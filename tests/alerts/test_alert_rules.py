"""Rules files: the shipped defaults load, bad files fail with a message naming rule and field,
and the CLI turns them into exit code 2 (never a traceback)."""

from __future__ import annotations

import pytest
import yaml

from specwatch.alerts.rules import DEFAULT_RULES, RulesError, format_duration, load_config, parse_duration
from specwatch.cli import main

GOOD = {"name": "R", "signal": "ttft_p99", "op": ">", "threshold": 0.3, "window": "5m"}


def test_shipped_defaults_hold_the_production_thresholds():
    config = load_config(DEFAULT_RULES)
    rules = {r.name: r for r in config.rules}
    expected = {
        "SpecAcceptanceLow": ("acceptance_rate", "<", 0.6, 300),
        "SpecAcceptanceUnstable": ("acceptance_stddev", ">", 0.15, 300),
        "TTFTP99High": ("ttft_p99", ">", 0.3, 300),
        "MemoryFragmentationHigh": ("fragmentation", ">", 1.2, 60),
        "DraftUtilizationSwing": ("draft_util_swing", ">", 30, 300),
        "LatencyRegressionUnderSpeculation": ("spec_latency_regression", ">", 0.1, 900),
        "OOMBurst": ("oom_count", ">=", 3, 600),
        "SpeculationCostsMore": ("spec_cost_excess", ">", 0.05, 3600),
    }
    for name, (signal, op, threshold, window) in expected.items():
        assert (rules[name].signal, rules[name].op, rules[name].threshold, rules[name].window) == (
            signal,
            op,
            threshold,
            window,
        )
    assert rules["MemoryFragmentationHigh"].for_ == 300
    assert rules["TTFTP99High"].actions == ("fallback_autoregressive",)
    assert rules["MemoryFragmentationHigh"].actions == ("defragment",)
    assert rules["SpecAcceptanceLow"].min_samples >= 10


@pytest.mark.parametrize(
    "change, message",
    [
        ({"signal": "acceptance_mean"}, "rules[0] (R).signal: unknown signal 'acceptance_mean'"),
        ({"window": "5 minutes"}, "rules[0] (R).window: not a duration: '5 minutes'"),
        ({"for": "-1m"}, "rules[0] (R).for: not a duration"),
        ({"threshold": "high"}, "rules[0] (R).threshold: Input should be a valid number"),
        ({"threshold": float("nan")}, "rules[0] (R).threshold: Input should be a finite number"),
        ({"op": "=="}, "rules[0] (R).op: Input should be '<', '<=', '>' or '>='"),
        ({"group_by": ["device"]}, "signal ttft_p99 cannot be grouped by ['device']"),
        ({"actions": ["reboot"]}, "rules[0] (R).actions[0]: Input should be"),
        ({"min_samples": -1}, "rules[0] (R).min_samples: Input should be greater than or equal to 0"),
        ({"severity": "page"}, "rules[0] (R).severity"),
        ({"tresh": 1}, "rules[0] (R).tresh: Extra inputs are not permitted"),
    ],
)
def test_bad_rules_are_named(tmp_path, change, message):
    path = tmp_path / "rules.yaml"
    path.write_text(yaml.safe_dump({"rules": [GOOD | change]}))
    with pytest.raises(RulesError) as caught:
        load_config(path)
    assert message in str(caught.value) and str(path) in str(caught.value)


@pytest.mark.parametrize(
    "text, message",
    [
        ("rules: [", "not valid YAML"),
        ("- just\n- a list\n", "expected a mapping"),
        (
            "rules:\n  - {name: A, signal: ttft_p99, op: '>', threshold: 1, window: 1m}\n"
            "  - {name: A, signal: ttft_p99, op: '>', threshold: 2, window: 1m}\n",
            "duplicate rule names: ['A']",
        ),
        ("receivers:\n  - {name: x, url: 'ftp://nope'}\n", "receivers[0] (x).url"),
    ],
)
def test_bad_files(tmp_path, text, message):
    path = tmp_path / "rules.yaml"
    path.write_text(text)
    with pytest.raises(RulesError, match=message.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        load_config(path)


def test_missing_file_and_env_override(tmp_path, monkeypatch):
    with pytest.raises(RulesError, match="cannot read rules file"):
        load_config(tmp_path / "absent.yaml")
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump({"rules": [GOOD]}))
    monkeypatch.setenv("SPECWATCH_ALERT_RULES", str(path))
    assert [r.name for r in load_config().rules] == ["R"]


@pytest.mark.parametrize(
    "text, seconds", [("90s", 90), ("5m", 300), ("1h30m", 5400), ("250ms", 0.25), (15, 15), ("0s", 0)]
)
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


def test_durations_format_the_prometheus_way():
    assert [format_duration(s) for s in (0, 0.5, 30, 300, 5400, 86400)] == ["0s", "500ms", "30s", "5m", "90m", "1d"]


def test_cli_check_and_bad_file_exit_code(tmp_path, capsys):
    assert main(["alerts", "check"]) == 0
    assert "SpecAcceptanceLow" in capsys.readouterr().out
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump({"rules": [GOOD | {"signal": "nope"}]}))
    assert main(["alerts", "check", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "unknown signal 'nope'" in err and "Traceback" not in err


def test_cli_run_once_over_an_empty_store(tmp_path, capsys):
    assert main(["alerts", "run", "--once", "--db", f"sqlite:///{tmp_path / 'db.sqlite'}"]) == 0
    assert "13 rules in" in capsys.readouterr().out


@pytest.mark.parametrize(
    "db, message",
    [
        ("not a url", "--db is not a database URL"),
        ("postgresql+psycopg://nobody@127.0.0.1:9/none", "cannot reach the database"),
    ],
)
def test_cli_run_with_a_bad_database_exits_2(db, message, capsys):
    assert main(["alerts", "run", "--once", "--db", db]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
