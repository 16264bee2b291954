"""Alert rules as a Prometheus rule file, with promtool unit tests generated from the same config.

Two groups: `specwatch` reads the collector's own /metrics (collector/metrics.py) and
`specwatch-vllm` reads vLLM's native /metrics, for teams whose Prometheus scrapes vLLM directly.
Scrape the collector with `honor_labels: true`: its `instance` label names the engine
instance, which Prometheus would otherwise rename `exported_instance` under the target's own.

Each rule's expression is its signal's PromQL, read from the signal's entry in `alerts.signals`
(`Signal.promql`: a value expression plus a count expression, the observations behind the value,
so `min_samples` reads `... and on (labels) count >= n`). Where PromQL differs from the store
signal, the entry's `promql_note` goes into the rule's annotations (spec_latency_regression has no
Mann-Whitney test); spec_cost_excess reads the device-time counters (the same requests: ok, with
output, carrying device_s), and gauge counts (fragmentation, draft_util_swing) count scrapes.

`unit_tests` builds, for every exported rule, input series that make it fire and series
that keep it quiet; the counters grow linearly from zero, so rate() ratios and increase()
are exact whatever Prometheus's extrapolation, and the expected `$value` can be predicted.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from specwatch.alerts.promql import AS_VLLM, PromQL, Series, num
from specwatch.alerts.rules import AlertConfig, Rule, RulesError, format_duration
from specwatch.alerts.signals import SIGNALS

RULES_FILE = "specwatch-rules.yaml"
TESTS_FILE = "specwatch-rules.test.yaml"
GROUP, VLLM_GROUP = "specwatch", "specwatch-vllm"
_VALUE = re.compile(r"{{\s*\$value\s*}}")
_LABEL = re.compile(r"{{\s*\$labels\.(\w+)\s*}}")
_PRINTF = '{{ $value | printf "%.3g" }}'  # the evaluator renders $value with .3g too


@dataclass(frozen=True)
class _Export:
    """One rule as exported: its PromQL, the metric labels it keeps, its templates."""

    rule: Rule
    name: str
    group: str
    query: PromQL
    by: tuple[str, ...]  # metric labels of the alert
    expr: str
    annotations: dict[str, str]


def _export(rule: Rule, query: PromQL, group: str, labels: dict[str, str | None], name: str, note: str = "") -> _Export:
    if bad := [g for g in rule.group_by if g not in labels]:
        raise RulesError(
            f"rule {rule.name}: signal {rule.signal} cannot be grouped by {bad} in Prometheus "
            f"(its metrics carry {sorted(k for k, v in labels.items() if v)})"
        )
    by = tuple(dict.fromkeys(m for g in rule.group_by if (m := labels[g])))
    w, joined = format_duration(rule.window), ", ".join(by)
    expr = f"{query.value(joined, w)} {rule.op} {num(rule.threshold)}"
    if rule.min_samples > (1 if query.gauge else 0):
        expr += f"\nand on ({joined}) {query.count(joined, w)} >= {rule.min_samples}"

    def template(text: str) -> str:  # $labels named as the metric names them; $value as the evaluator shows it
        text = _LABEL.sub(lambda m: f"{{{{ $labels.{labels.get(m.group(1)) or m.group(1)} }}}}", text)
        return _VALUE.sub(lambda _: _PRINTF, text)

    texts = {"summary": template(rule.summary), "description": template(rule.description), "note": note}
    return _Export(rule, name, group, query, by, expr, {k: v for k, v in texts.items() if v})


def _exports(config: AlertConfig) -> list[_Export]:
    """Every exported rule: the config's rules in their group, then vLLM equivalents of specwatch ones."""
    own, vllm = [], []
    for rule in config.rules:
        signal = SIGNALS[rule.signal]
        group = VLLM_GROUP if rule.signal.startswith("vllm_") else GROUP
        exported = _export(rule, signal.promql, group, signal.promql.labels, rule.name, signal.promql_note)
        (vllm if group == VLLM_GROUP else own).append(exported)
    names = {e.name for e in own + vllm}
    for rule in config.rules:
        if equivalent := SIGNALS[rule.signal].vllm_equivalent:
            note = f"vLLM equivalent of the specwatch rule {rule.name}, over vLLM's native metrics."
            derived = _export(rule, SIGNALS[equivalent].promql, VLLM_GROUP, AS_VLLM, f"Vllm{rule.name}", note)
            if any(e.expr == derived.expr and e.rule.for_ == rule.for_ for e in vllm):
                continue  # an explicit vllm_* rule already alerts on exactly this
            if derived.name in names:
                raise RulesError(
                    f"rule {rule.name}: its vLLM equivalent's name {derived.name} is taken by another rule"
                )
            vllm.append(derived)
    return own + vllm


def _rule_entry(e: _Export) -> dict:
    entry: dict = {"alert": e.name, "expr": e.expr}
    if e.rule.for_ > 0:
        entry["for"] = format_duration(e.rule.for_)
    if e.rule.keep_firing_for > 0:
        entry["keep_firing_for"] = format_duration(e.rule.keep_firing_for)
    return {**entry, "labels": {"severity": e.rule.severity}, "annotations": e.annotations}


def rule_groups(config: AlertConfig) -> dict:
    """The Prometheus rule file (`groups:`) for `config`'s rules."""
    exports, interval = _exports(config), format_duration(config.evaluation.interval)
    return {
        "groups": [
            {"name": group, "interval": interval, "rules": [_rule_entry(e) for e in exports if e.group == group]}
            for group in (GROUP, VLLM_GROUP)
        ]
    }


def _side(rule: Rule, domain: tuple[float, float], fire: bool) -> float:
    """A round value inside the signal's domain on the firing (or the quiet) side of the threshold."""
    up = (rule.op in (">", ">=")) == fire
    edge = domain[1] if up else domain[0]
    t = rule.threshold
    target = t + (abs(t) or 1.0) * (1 if up else -1) if math.isinf(edge) else (t + edge) / 2
    for digits in range(2, 18):
        value = float(f"{target:.{digits}g}")
        if rule.holds(value) == fire and domain[0] <= value <= domain[1]:
            return value
    side = "fire" if fire else "stay quiet"
    raise RulesError(
        f"rule {rule.name}: cannot {side} ({rule.signal} {rule.op} {num(t)}, {rule.signal} is in {domain})"
    )


def _above_min_samples(rule: Rule, fire: float) -> float:
    """A firing value that is also its own count (oom_count): clear of min_samples, where float sums
    round either way."""
    m = rule.min_samples
    for value in (fire, 1.5 * m, (m + rule.threshold) / 2):
        if value > m * 1.001 and rule.holds(value):
            return value
    raise RulesError(
        f"rule {rule.name}: cannot fire with min_samples {m} ({rule.signal} {rule.op} {num(rule.threshold)})"
    )


def _render(text: str, labels: dict[str, str], value: float) -> str:
    """What Prometheus makes of the exported templates (missing labels render empty)."""
    out = _LABEL.sub(lambda m: labels.get(m.group(1), ""), text.replace(_PRINTF, f"{value:.3g}"))
    if "{{" in out:
        raise RulesError(
            f"cannot predict how Prometheus renders {text!r}: only {{{{ $value }}}} and "
            "{{ $labels.<name> }} are supported"
        )
    return out


def _test(e: _Export, case: str, value: float, interval_s: float, few: bool = False) -> dict:
    """One promtool test group: series for `value`, checked once the rule's `for` has passed."""
    rule, q = e.rule, e.query
    step_s = math.floor(rule.window * 1000 / (max(5, 2 * rule.min_samples) if q.gauge else 5)) / 1000  # whole ms
    eval_s = math.ceil((rule.window + rule.for_ + 2 * max(step_s, interval_s)) / interval_s) * interval_s
    steps = math.floor(eval_s / step_s + 1e-9)  # the last sample is the one at (or just before) eval_time
    if q.gauge:
        per_window = rule.min_samples - 1 if few else steps + 1
    else:
        per_window = rule.min_samples / 2 if few else max(2 * rule.min_samples, 10)
    s = Series(q.series_labels, value, per_window, steps, rule.window / step_s)
    alert_labels = {m: q.series_labels[m] for m in e.by}
    expected = (
        []
        if case != "fires"
        else [
            {
                "exp_labels": {**alert_labels, "severity": rule.severity},
                "exp_annotations": {k: _render(v, alert_labels, value) for k, v in e.annotations.items()},
            }
        ]
    )
    return {
        "name": f"{e.name} {case}",
        "interval": format_duration(step_s),
        "input_series": q.series(s),
        "alert_rule_test": [{"eval_time": format_duration(eval_s), "alertname": e.name, "exp_alerts": expected}],
    }


def _tests(e: _Export, interval_s: float) -> list[dict]:
    """Fires; stays quiet on the other side of the threshold; stays quiet with too few samples."""
    rule, q = e.rule, e.query
    fire, quiet = _side(rule, q.domain, True), _side(rule, q.domain, False)
    if q.count_is_value and rule.min_samples:
        fire = _above_min_samples(rule, fire)
    tests = [_test(e, "fires", fire, interval_s), _test(e, "stays quiet", quiet, interval_s)]
    if rule.min_samples >= 2 and not q.count_is_value:
        tests.append(_test(e, "needs min_samples", fire, interval_s, few=True))
    return tests


def unit_tests(config: AlertConfig) -> dict:
    """A promtool test file for `rule_groups(config)` written next to it as RULES_FILE."""
    interval = config.evaluation.interval
    return {
        "rule_files": [RULES_FILE],
        "evaluation_interval": format_duration(interval),
        "tests": [test for e in _exports(config) for test in _tests(e, interval)],
    }


class _Dumper(yaml.SafeDumper):
    """SafeDumper writing multi-line strings (the PromQL) as literal blocks."""


_Dumper.add_representer(
    str, lambda d, s: d.represent_scalar("tag:yaml.org,2002:str", s, style="|" if "\n" in s else None)
)


def export(config: AlertConfig, out_dir: str | Path) -> tuple[Path, Path]:
    """Write RULES_FILE and TESTS_FILE into `out_dir` (`promtool test rules` takes the second)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = (out / RULES_FILE, out / TESTS_FILE)
    for path, data in zip(paths, (rule_groups(config), unit_tests(config))):
        path.write_text(yaml.dump(data, Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=1000))
    return paths
