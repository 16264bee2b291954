"""The alert state machine, stepped through (t, signal value, expected state) tables.

No clock, no sleeps: each row is one evaluation at time t with the signal's value (None: no
sample this cycle) and the state the single alert must then be in ('-' = no alert kept).
"""

from __future__ import annotations

import pytest

from specwatch.alerts.evaluator import State, evaluate, fingerprint, needs_sending, render
from specwatch.alerts.rules import parse_config
from specwatch.alerts.signals import Reading

LABELS = (("instance", "a"),)


def make_rule(**overrides):
    rule = {
        "name": "AcceptanceLow",
        "signal": "acceptance_rate",
        "op": "<",
        "threshold": 0.6,
        "window": "5m",
        "for": "60s",
        "min_samples": 10,
        "group_by": ["instance"],
        "summary": "acceptance {{ $value }} on {{ $labels.instance }}",
    } | overrides
    return parse_config({"rules": [rule]}).rules[0]


def run_table(rule, table, retention=900.0):
    alerts = {}
    for t, value, expected, *count in table:
        samples = [] if value is None else [Reading(LABELS, value, count[0] if count else 100)]
        alerts = evaluate(t, rule, samples, alerts, retention).alerts
        states = [str(a.state) for a in alerts.values()]
        assert states == ([] if expected == "-" else [expected]), f"t={t} value={value}: {states} != {expected}"
    return alerts


def test_for_duration_pending_then_firing_then_resolved():
    run_table(
        make_rule(),
        [
            (0, 0.9, "-"),
            (15, 0.5, "pending"),
            (30, 0.4, "pending"),
            (74, 0.4, "pending"),  # active 59 s < for 60 s
            (75, 0.4, "firing"),  # active 60 s
            (90, 0.55, "firing"),
            (105, 0.7, "inactive"),  # resolved, kept to send "resolved"
            (120, 0.7, "inactive"),
        ],
    )


def test_pending_alert_dropped_when_condition_clears_and_restarts_its_clock():
    run_table(
        make_rule(),
        [
            (0, 0.5, "pending"),
            (30, 0.8, "-"),
            (45, 0.5, "pending"),  # new active_at = 45
            (90, 0.5, "pending"),  # 45 s active
            (105, 0.5, "firing"),
        ],
    )


def test_zero_for_fires_at_once():
    run_table(make_rule(**{"for": "0s"}), [(0, 0.5, "firing"), (15, 0.9, "inactive")])


def test_min_samples_counts_as_no_data():
    run_table(
        make_rule(**{"for": "0s"}),
        [
            (0, 0.1, "-", 3),  # 3 requests: no alert however bad
            (15, 0.1, "firing", 10),
            (30, 0.1, "inactive", 9),  # too few samples again: resolves
        ],
    )


def test_keep_firing_for_holds_a_flapping_alert():
    run_table(
        make_rule(**{"for": "0s", "keep_firing_for": "60s"}),
        [
            (0, 0.5, "firing"),
            (15, 0.9, "firing"),  # condition gone 15 s ago
            (30, 0.5, "firing"),  # back: last_seen moves to 30
            (75, None, "firing"),  # no data 45 s
            (90, None, "inactive"),  # 60 s since last seen
        ],
    )


def test_resolved_alert_is_forgotten_after_retention_and_refires_as_new():
    alerts = run_table(
        make_rule(**{"for": "0s"}),
        [
            (0, 0.5, "firing"),
            (15, 0.9, "inactive"),
            (914, 0.9, "inactive"),
            (916, 0.9, "-"),  # > 900 s after resolve
            (930, 0.5, "firing"),
        ],
        retention=900.0,
    )
    (alert,) = alerts.values()
    assert alert.active_at == alert.fired_at == 930 and alert.resolved_at is None


def test_signal_error_keeps_state_and_reports_it():
    rule = make_rule(**{"for": "0s"})
    alerts = evaluate(0, rule, [Reading(LABELS, 0.5, 100)], {}).alerts
    outcome = evaluate(15, rule, RuntimeError("database is locked"), alerts)
    assert outcome.alerts == alerts and outcome.transitions == []
    assert outcome.error == "RuntimeError: database is locked"


def test_label_sets_are_separate_alerts_with_rendered_annotations():
    rule = make_rule(**{"for": "0s"})
    samples = [
        Reading((("instance", "a"),), 0.5, 50),
        Reading((("instance", "b"),), 0.2, 50),
        Reading((("instance", "c"),), 0.9, 50),
    ]
    alerts = evaluate(0, rule, samples, {}).alerts
    by_instance = {a.labels["instance"]: a for a in alerts.values()}
    assert sorted(by_instance) == ["a", "b"]
    assert by_instance["b"].annotations["summary"] == "acceptance 0.2 on b"
    labels = {"alertname": "AcceptanceLow", "severity": "warning", "instance": "b"}
    assert by_instance["b"].labels == labels and by_instance["b"].fingerprint == fingerprint(labels)


def test_insignificant_sample_does_not_alert():
    rule = make_rule(signal="spec_latency_regression", op=">", threshold=0.1, group_by=[], **{"for": "0s"})
    assert evaluate(0, rule, [Reading((), 0.5, 100, significant=False)], {}).alerts == {}
    assert len(evaluate(0, rule, [Reading((), 0.5, 100, significant=True)], {}).alerts) == 1


@pytest.mark.parametrize(
    "op, threshold, value, holds",
    [
        ("<", 0.6, 0.59, True),
        ("<", 0.6, 0.6, False),
        ("<=", 0.6, 0.6, True),
        (">", 0.3, 0.31, True),
        (">", 0.3, 0.3, False),
        (">=", 3, 3, True),
        (">=", 3, 2, False),
    ],
)
def test_comparisons(op, threshold, value, holds):
    assert make_rule(op=op, threshold=threshold).holds(value) is holds


def test_needs_sending_on_fire_repeat_and_resolve():
    rule = make_rule(**{"for": "30s"})
    table = [  # (t, value, needs sending at t)
        (0, 0.5, False),  # pending: never sent
        (30, 0.5, True),  # fired
        (45, 0.5, False),  # sent at 30, repeat every 3600
        (3630, 0.5, True),  # repeat interval passed
        (3645, 0.9, True),  # resolved: send once
        (3660, 0.9, False),
    ]
    alerts = {}
    for t, value, expected in table:
        alerts = evaluate(t, rule, [Reading(LABELS, value, 100)], alerts).alerts
        ((fp, alert),) = alerts.items()
        assert needs_sending(alert, t, repeat_interval=3600) is expected, f"t={t}"
        if expected:
            alerts[fp] = type(alert)(**{**alert.__dict__, "last_sent_at": t})


def test_transitions_are_recorded_in_order():
    rule = make_rule(**{"for": "15s"})
    alerts, log = {}, []
    for t, value in [(0, 0.5), (15, 0.5), (30, 0.9)]:
        outcome = evaluate(t, rule, [Reading(LABELS, value, 100)], alerts)
        alerts, log = outcome.alerts, log + [(x.at, x.from_state, x.to_state) for x in outcome.transitions]
    assert log == [
        (0, State.INACTIVE, State.PENDING),
        (15, State.PENDING, State.FIRING),
        (30, State.FIRING, State.INACTIVE),
    ]


def test_render_templates():
    assert (
        render("{{ $value }} {{$labels.instance}} {{ $labels.missing }}!", {"instance": "x"}, 0.123456) == "0.123 x !"
    )
