"""Alert rules as a Prometheus rule file, with promtool unit tests generated from the same config.

Two groups: `specwatch` reads the collector's own /metrics (collector/metrics.py) and
`specwatch-vllm` reads vLLM's native /metrics, for teams whose Prometheus scrapes vLLM directly.
Scrape the collector with `honor_labels: true`: its `instance` label names the engine
instance, which Prometheus would otherwise rename `exported_instance` under the target's own.

Each signal (alerts/signals.py) becomes a value expression plus a count expression, the
observations behind the value, so `min_samples` reads `... and on (labels) count >= n`.
Where PromQL differs from the store signal, the rule says so: spec_latency_regression has
no Mann-Whitney test, spec_cost_excess reads the device-time counters (the same requests:
ok, with output, carrying device_s), and gauge counts (fragmentation, draft_util_swing) count scrapes.

`unit_tests` builds, for every exported rule, input series that make it fire and series
that keep it quiet; the counters grow linearly from zero, so rate() ratios and increase()
are exact whatever Prometheus's extrapolation, and the expected `$value` can be predicted.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import yaml

from alerts.rules import AlertConfig, Rule, RulesError, format_duration

RULES_FILE = "specwatch-rules.yaml"
TESTS_FILE = "specwatch-rules.test.yaml"
GROUP, VLLM_GROUP = "specwatch", "specwatch-vllm"
_VALUE = re.compile(r"{{\s*\$value\s*}}")
_LABEL = re.compile(r"{{\s*\$labels\.(\w+)\s*}}")
_PRINTF = '{{ $value | printf "%.3g" }}'  # the evaluator renders $value with .3g too


@dataclass(frozen=True)
class _Series:
    """What a test case asks of its input series: the value, observations per window, timing."""

    labels: dict[str, str]  # every label the metrics carry
    value: float
    per_window: float  # counters: observations in one rule window; gauges: samples present (the last ones)
    steps: int  # sample intervals in each series, up to eval_time
    window_steps: float  # sample intervals per rule window

    def counter(self, metric: str, per_window: float, **extra: str) -> dict:
        step = per_window / self.window_steps
        return {"series": _selector(metric, {**self.labels, **extra}), "values": f"0+{_num(step)}x{self.steps}"}

    def gauge(self, metric: str, values: list[float], present: int) -> dict:
        """Repeat `values` cyclically; only the last `present` samples exist."""
        points = [_num(values[i % len(values)]) if i > self.steps - present else "_" for i in range(self.steps + 1)]
        return {"series": _selector(metric, self.labels), "values": " ".join(points)}


@dataclass(frozen=True)
class _Query:
    """One signal in PromQL: `value(by, window)`, `count(by, window)` and test series for them."""

    labels: dict[str, str | None]  # rule label -> metric label (None: dropped; absent: cannot group)
    series_labels: dict[str, str]  # the metrics' label set, with values for the test series
    value: Callable[[str, str], str]
    count: Callable[[str, str], str]
    series: Callable[[_Series], list[dict]]
    domain: tuple[float, float]  # the values the signal can take
    gauge: bool = False  # counts scrapes: any value implies count >= 1
    count_is_value: bool = False


def _num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def _selector(metric: str, labels: dict[str, str]) -> str:
    return metric + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def _sum(metric: str, by: str, w: str, fn: str = "rate") -> str:
    return f"sum by ({by}) ({fn}({metric}[{w}]))"


def _ratio(num: str, den: str) -> Callable[[str, str], str]:
    return lambda by, w: f"{_sum(num, by, w)}\n  / {_sum(den, by, w)}"


def _p99(metric: str) -> Callable[[str, str], str]:
    return lambda by, w: f"histogram_quantile(0.99, sum by (le{', ' if by else ''}{by}) (rate({metric}_bucket[{w}])))"


def _increase(metric: str, selector: str = "") -> Callable[[str, str], str]:
    return lambda by, w: _sum(metric + selector, by, w, "increase")


def _scrapes(metric: str) -> Callable[[str, str], str]:
    return lambda by, w: _sum(metric, by, w, "count_over_time")


def _stddev(by: str, w: str) -> str:
    """sqrt(E[x^2] - E[x]^2) of per-request acceptance; clamp_min absorbs rounding below zero."""
    mean = _ratio("specwatch_acceptance_rate_sum_total", "specwatch_acceptance_rate_requests_total")(by, w)
    squares = _ratio("specwatch_acceptance_rate_squares_total", "specwatch_acceptance_rate_requests_total")(by, w)
    return f"sqrt(clamp_min(\n  {squares}\n  - ({mean}) ^ 2, 0))"


def _arm_mean(arm: str, by: str, w: str) -> str:
    per_token, requests = (
        f'{m}{{arm="{arm}"}}' for m in ("specwatch_arm_e2e_seconds_per_token_total", "specwatch_arm_requests_total")
    )
    return f"({_sum(per_token, by, w)}\n  / {_sum(requests, by, w)})"


def _regression(by: str, w: str) -> str:
    return f"{_arm_mean('spec', by, w)}\n/ {_arm_mean('control', by, w)} - 1"


def _fewest_arm(by: str, w: str) -> str:
    per_arm = _sum('specwatch_arm_requests_total{arm=~"spec|control"}', f"{by}, arm" if by else "arm", w, "increase")
    return f"min by ({by}) ({per_arm})"


def _device_s_per_token(mode: str, by: str, w: str) -> str:
    seconds, tokens = (
        f'{m}{{mode="{mode}"}}'
        for m in ("specwatch_device_seconds_total", "specwatch_device_timed_output_tokens_total")
    )
    return f"({_sum(seconds, by, w)}\n  / {_sum(tokens, by, w)})"


def _cost_excess(by: str, w: str) -> str:
    return f"{_device_s_per_token('speculative', by, w)}\n/ {_device_s_per_token('autoregressive', by, w)} - 1"


def _fewest_mode(by: str, w: str) -> str:
    requests = 'specwatch_device_timed_requests_total{mode=~"speculative|autoregressive"}'
    per_mode = _sum(requests, f"{by}, mode" if by else "mode", w, "increase")
    return f"min by ({by}) ({per_mode})"


def _swing(by: str, w: str) -> str:
    u = "specwatch_device_util_draft_ratio"
    return f"(max by ({by}) (max_over_time({u}[{w}])) - min by ({by}) (min_over_time({u}[{w}]))) * 100"


def _histogram(metric: str, s: _Series) -> list[dict]:
    """Every observation in [0, v / 0.99]: histogram_quantile(0.99) interpolates to v."""
    return [
        s.counter(f"{metric}_bucket", s.per_window, le=_num(s.value / 0.99)),
        s.counter(f"{metric}_bucket", s.per_window, le="+Inf"),
        s.counter(f"{metric}_count", s.per_window),
    ]


def _acceptance(s: _Series, accepted: str, drafted: str) -> list[dict]:
    return [s.counter(accepted, 100 * s.value), s.counter(drafted, 100)]


def _moments(s: _Series) -> list[dict]:
    """Requests with mean acceptance 0.5 and standard deviation `value`."""
    mean, n = 0.5, s.per_window
    return [
        s.counter("specwatch_acceptance_rate_requests_total", n),
        s.counter("specwatch_acceptance_rate_sum_total", n * mean),
        s.counter("specwatch_acceptance_rate_squares_total", n * (mean**2 + s.value**2)),
    ]


def _arms(s: _Series) -> list[dict]:
    control_s = 0.01  # seconds per output token
    return [
        series
        for arm, per_token in (("spec", control_s * (1 + s.value)), ("control", control_s))
        for series in (
            s.counter("specwatch_arm_requests_total", s.per_window, arm=arm),
            s.counter("specwatch_arm_e2e_seconds_per_token_total", s.per_window * per_token, arm=arm),
        )
    ]


def _modes(s: _Series) -> list[dict]:
    """Plain requests at 0.01 device-s per token, speculative ones at (1 + value) times that."""
    plain_s, tokens = 0.01, 100 * s.per_window
    return [
        series
        for mode, drafter, per_token in (
            ("speculative", "ngram", plain_s * (1 + s.value)),
            ("autoregressive", "none", plain_s),
        )
        for series in (
            s.counter("specwatch_device_timed_requests_total", s.per_window, mode=mode, drafter=drafter),
            s.counter("specwatch_device_timed_output_tokens_total", tokens, mode=mode, drafter=drafter),
            s.counter("specwatch_device_seconds_total", tokens * per_token, mode=mode, drafter=drafter),
        )
    ]


_REQUEST_LABELS = {"instance": "gpu-0", "model": "smollm2-135m", "mode": "speculative", "drafter": "ngram"}
_DEVICE_LABELS = {"instance": "gpu-0", "device": "cuda:0"}
_VLLM_LABELS = {
    "instance": "vllm-0:8000",
    "job": "vllm",
    "model_name": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "engine": "0",
}
_REQUESTS = {k: k for k in _REQUEST_LABELS}
_DEVICES = {k: k for k in _DEVICE_LABELS}
_FOREVER = (0.0, math.inf)

QUERIES: dict[str, _Query] = {
    "acceptance_rate": _Query(
        _REQUESTS,
        _REQUEST_LABELS,
        _ratio("specwatch_accepted_tokens_total", "specwatch_draft_tokens_total"),
        _increase("specwatch_acceptance_rate_requests_total"),
        lambda s: [
            *_acceptance(s, "specwatch_accepted_tokens_total", "specwatch_draft_tokens_total"),
            s.counter("specwatch_acceptance_rate_requests_total", s.per_window),
        ],
        (0.0, 1.0),
    ),
    "acceptance_stddev": _Query(
        _REQUESTS, _REQUEST_LABELS, _stddev, _increase("specwatch_acceptance_rate_requests_total"), _moments, (0.0, 0.5)
    ),
    "ttft_p99": _Query(
        _REQUESTS,
        _REQUEST_LABELS,
        _p99("specwatch_time_to_first_token_seconds"),
        _increase("specwatch_time_to_first_token_seconds_count"),
        lambda s: _histogram("specwatch_time_to_first_token_seconds", s),
        _FOREVER,
    ),
    "spec_latency_regression": _Query(
        {"instance": "instance", "model": "model"},
        {"instance": "gpu-0", "model": "smollm2-135m"},
        _regression,
        _fewest_arm,
        _arms,
        (-1.0, math.inf),
    ),
    "spec_cost_excess": _Query(
        {"instance": "instance", "model": "model"},
        {"instance": "gpu-0", "model": "smollm2-135m"},
        _cost_excess,
        _fewest_mode,
        _modes,
        (-1.0, math.inf),
    ),
    "oom_count": _Query(
        {"instance": "instance"},
        _REQUEST_LABELS,
        _increase("specwatch_oom_errors_total"),
        _increase("specwatch_oom_errors_total"),
        lambda s: [s.counter("specwatch_oom_errors_total", s.value)],
        _FOREVER,
        count_is_value=True,
    ),
    "fragmentation": _Query(
        _DEVICES,
        _DEVICE_LABELS,
        lambda by, w: f"avg by ({by}) (avg_over_time(specwatch_device_fragmentation_ratio[{w}]))",
        _scrapes("specwatch_device_fragmentation_ratio"),
        lambda s: [s.gauge("specwatch_device_fragmentation_ratio", [s.value], int(s.per_window))],
        _FOREVER,
        gauge=True,
    ),
    "draft_util_swing": _Query(
        _DEVICES,
        _DEVICE_LABELS,
        _swing,
        _scrapes("specwatch_device_util_draft_ratio"),
        lambda s: [s.gauge("specwatch_device_util_draft_ratio", [0.0, s.value / 100], int(s.per_window))],
        (0.0, 100.0),
        gauge=True,
    ),
    "vllm_acceptance_rate": _Query(
        {"source": "instance", "model": "model_name"},
        _VLLM_LABELS,
        _ratio("vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_draft_tokens_total"),
        _increase("vllm:e2e_request_latency_seconds_count"),
        lambda s: [
            *_acceptance(s, "vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_draft_tokens_total"),
            s.counter("vllm:e2e_request_latency_seconds_count", s.per_window),
        ],
        (0.0, 1.0),
    ),
    "vllm_ttft_p99": _Query(
        {"source": "instance", "model": "model_name"},
        _VLLM_LABELS,
        _p99("vllm:time_to_first_token_seconds"),
        _increase("vllm:e2e_request_latency_seconds_count"),
        lambda s: [
            *_histogram("vllm:time_to_first_token_seconds", s),
            s.counter("vllm:e2e_request_latency_seconds_count", s.per_window),
        ],
        _FOREVER,
    ),
}
# specwatch signals with a vLLM counterpart; vLLM serves one drafter and mode, so those labels drop.
_VLLM_EQUIVALENT = {"acceptance_rate": "vllm_acceptance_rate", "ttft_p99": "vllm_ttft_p99"}
_AS_VLLM = {"instance": "instance", "model": "model_name", "drafter": None, "mode": None}


@dataclass(frozen=True)
class _Export:
    """One rule as exported: its PromQL, the metric labels it keeps, its templates."""

    rule: Rule
    name: str
    group: str
    query: _Query
    by: tuple[str, ...]  # metric labels of the alert
    expr: str
    annotations: dict[str, str]


def _export(rule: Rule, query: _Query, group: str, labels: dict[str, str | None], name: str, note: str = "") -> _Export:
    if bad := [g for g in rule.group_by if g not in labels]:
        raise RulesError(
            f"rule {rule.name}: signal {rule.signal} cannot be grouped by {bad} in Prometheus "
            f"(its metrics carry {sorted(k for k, v in labels.items() if v)})"
        )
    by = tuple(dict.fromkeys(m for g in rule.group_by if (m := labels[g])))
    w, joined = format_duration(rule.window), ", ".join(by)
    expr = f"{query.value(joined, w)} {rule.op} {_num(rule.threshold)}"
    if rule.min_samples > (1 if query.gauge else 0):
        expr += f"\nand on ({joined}) {query.count(joined, w)} >= {rule.min_samples}"

    def template(text: str) -> str:  # $labels named as the metric names them; $value as the evaluator shows it
        text = _LABEL.sub(lambda m: f"{{{{ $labels.{labels.get(m.group(1)) or m.group(1)} }}}}", text)
        return _VALUE.sub(lambda _: _PRINTF, text)

    texts = {"summary": template(rule.summary), "description": template(rule.description), "note": note}
    return _Export(rule, name, group, query, by, expr, {k: v for k, v in texts.items() if v})


_REGRESSION_NOTE = (
    "In Prometheus this is the ratio of the arms' mean latency per token only; specwatch's own "
    "evaluator also requires a one-sided Mann-Whitney U test (p < 0.05), which PromQL cannot do."
)


def _exports(config: AlertConfig) -> list[_Export]:
    """Every exported rule: the config's rules in their group, then vLLM equivalents of specwatch ones."""
    own, vllm = [], []
    for rule in config.rules:
        if (query := QUERIES.get(rule.signal)) is None:
            raise RulesError(f"rule {rule.name}: signal {rule.signal} has no Prometheus expression")
        group = VLLM_GROUP if rule.signal.startswith("vllm_") else GROUP
        note = _REGRESSION_NOTE if rule.signal == "spec_latency_regression" else ""
        (vllm if group == VLLM_GROUP else own).append(_export(rule, query, group, query.labels, rule.name, note))
    names = {e.name for e in own + vllm}
    for rule in config.rules:
        if rule.signal in _VLLM_EQUIVALENT:
            note = f"vLLM equivalent of the specwatch rule {rule.name}, over vLLM's native metrics."
            derived = _export(
                rule, QUERIES[_VLLM_EQUIVALENT[rule.signal]], VLLM_GROUP, _AS_VLLM, f"Vllm{rule.name}", note
            )
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
        f"rule {rule.name}: cannot {side} ({rule.signal} {rule.op} {_num(t)}, {rule.signal} is in {domain})"
    )


def _above_min_samples(rule: Rule, fire: float) -> float:
    """A firing value that is also its own count (oom_count): clear of min_samples, where float sums
    round either way."""
    m = rule.min_samples
    for value in (fire, 1.5 * m, (m + rule.threshold) / 2):
        if value > m * 1.001 and rule.holds(value):
            return value
    raise RulesError(
        f"rule {rule.name}: cannot fire with min_samples {m} ({rule.signal} {rule.op} {_num(rule.threshold)})"
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
    s = _Series(q.series_labels, value, per_window, steps, rule.window / step_s)
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
