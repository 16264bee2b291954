"""Alert signals in PromQL: the expression builders each signal's entry in `alerts.signals` uses, and
the input series that promtool unit tests feed them (`alerts.prometheus`).

A signal becomes a value expression plus a count expression, the observations behind the value, so
`min_samples` reads `... and on (labels) count >= n`. Test counters grow linearly from zero, so
rate() ratios and increase() are exact whatever Prometheus's extrapolation, and the expected
`$value` can be predicted.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Series:
    """What a test case asks of its input series: the value, observations per window, timing."""

    labels: dict[str, str]  # every label the metrics carry
    value: float
    per_window: float  # counters: observations in one rule window; gauges: samples present (the last ones)
    steps: int  # sample intervals in each series, up to eval_time
    window_steps: float  # sample intervals per rule window

    def counter(self, metric: str, per_window: float, **extra: str) -> dict:
        step = per_window / self.window_steps
        return {"series": selector(metric, {**self.labels, **extra}), "values": f"0+{num(step)}x{self.steps}"}

    def gauge(self, metric: str, values: list[float], present: int) -> dict:
        """Repeat `values` cyclically; only the last `present` samples exist."""
        points = [num(values[i % len(values)]) if i > self.steps - present else "_" for i in range(self.steps + 1)]
        return {"series": selector(metric, self.labels), "values": " ".join(points)}


@dataclass(frozen=True)
class PromQL:
    """One signal in PromQL: `value(by, window)`, `count(by, window)` and test series for them."""

    labels: dict[str, str | None]  # rule label -> metric label (None: dropped; absent: cannot group)
    series_labels: dict[str, str]  # the metrics' label set, with values for the test series
    value: Callable[[str, str], str]
    count: Callable[[str, str], str]
    series: Callable[[Series], list[dict]]
    domain: tuple[float, float]  # the values the signal can take
    gauge: bool = False  # counts scrapes: any value implies count >= 1
    count_is_value: bool = False


def num(x: float) -> str:
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def selector(metric: str, labels: dict[str, str]) -> str:
    return metric + "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}"


def sum_by(metric: str, by: str, w: str, fn: str = "rate") -> str:
    return f"sum by ({by}) ({fn}({metric}[{w}]))"


def ratio(num: str, den: str) -> Callable[[str, str], str]:
    return lambda by, w: f"{sum_by(num, by, w)}\n  / {sum_by(den, by, w)}"


def p99(metric: str) -> Callable[[str, str], str]:
    return lambda by, w: f"histogram_quantile(0.99, sum by (le{', ' if by else ''}{by}) (rate({metric}_bucket[{w}])))"


def increase(metric: str, selector: str = "") -> Callable[[str, str], str]:
    return lambda by, w: sum_by(metric + selector, by, w, "increase")


def scrapes(metric: str) -> Callable[[str, str], str]:
    return lambda by, w: sum_by(metric, by, w, "count_over_time")


def stddev(by: str, w: str) -> str:
    """sqrt(E[x^2] - E[x]^2) of per-request acceptance; clamp_min absorbs rounding below zero."""
    mean = ratio("specwatch_acceptance_rate_sum_total", "specwatch_acceptance_rate_requests_total")(by, w)
    squares = ratio("specwatch_acceptance_rate_squares_total", "specwatch_acceptance_rate_requests_total")(by, w)
    return f"sqrt(clamp_min(\n  {squares}\n  - ({mean}) ^ 2, 0))"


def arm_mean(arm: str, by: str, w: str) -> str:
    per_token, requests = (
        f'{m}{{arm="{arm}"}}' for m in ("specwatch_arm_e2e_seconds_per_token_total", "specwatch_arm_requests_total")
    )
    return f"({sum_by(per_token, by, w)}\n  / {sum_by(requests, by, w)})"


def regression(by: str, w: str) -> str:
    return f"{arm_mean('spec', by, w)}\n/ {arm_mean('control', by, w)} - 1"


def fewest_arm(by: str, w: str) -> str:
    per_arm = sum_by('specwatch_arm_requests_total{arm=~"spec|control"}', f"{by}, arm" if by else "arm", w, "increase")
    return f"min by ({by}) ({per_arm})"


def device_s_per_token(mode: str, by: str, w: str) -> str:
    seconds, tokens = (
        f'{m}{{mode="{mode}"}}'
        for m in ("specwatch_device_seconds_total", "specwatch_device_timed_output_tokens_total")
    )
    return f"({sum_by(seconds, by, w)}\n  / {sum_by(tokens, by, w)})"


def cost_excess(by: str, w: str) -> str:
    return f"{device_s_per_token('speculative', by, w)}\n/ {device_s_per_token('autoregressive', by, w)} - 1"


def fewest_mode(by: str, w: str) -> str:
    requests = 'specwatch_device_timed_requests_total{mode=~"speculative|autoregressive"}'
    per_mode = sum_by(requests, f"{by}, mode" if by else "mode", w, "increase")
    return f"min by ({by}) ({per_mode})"


def swing(by: str, w: str) -> str:
    u = "specwatch_device_util_draft_ratio"
    return f"(max by ({by}) (max_over_time({u}[{w}])) - min by ({by}) (min_over_time({u}[{w}]))) * 100"


def histogram(metric: str, s: Series) -> list[dict]:
    """Every observation in [0, v / 0.99]: histogram_quantile(0.99) interpolates to v."""
    return [
        s.counter(f"{metric}_bucket", s.per_window, le=num(s.value / 0.99)),
        s.counter(f"{metric}_bucket", s.per_window, le="+Inf"),
        s.counter(f"{metric}_count", s.per_window),
    ]


def acceptance(s: Series, accepted: str, drafted: str) -> list[dict]:
    return [s.counter(accepted, 100 * s.value), s.counter(drafted, 100)]


def moments(s: Series) -> list[dict]:
    """Requests with mean acceptance 0.5 and standard deviation `value`."""
    mean, n = 0.5, s.per_window
    return [
        s.counter("specwatch_acceptance_rate_requests_total", n),
        s.counter("specwatch_acceptance_rate_sum_total", n * mean),
        s.counter("specwatch_acceptance_rate_squares_total", n * (mean**2 + s.value**2)),
    ]


def arms(s: Series) -> list[dict]:
    control_s = 0.01  # seconds per output token
    return [
        series
        for arm, per_token in (("spec", control_s * (1 + s.value)), ("control", control_s))
        for series in (
            s.counter("specwatch_arm_requests_total", s.per_window, arm=arm),
            s.counter("specwatch_arm_e2e_seconds_per_token_total", s.per_window * per_token, arm=arm),
        )
    ]


def modes(s: Series) -> list[dict]:
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


REQUEST_SERIES = {"instance": "gpu-0", "model": "smollm2-135m", "mode": "speculative", "drafter": "ngram"}
DEVICE_SERIES = {"instance": "gpu-0", "device": "cuda:0"}
VLLM_SERIES = {
    "instance": "vllm-0:8000",
    "job": "vllm",
    "model_name": "HuggingFaceTB/SmolLM2-135M-Instruct",
    "engine": "0",
}
REQUESTS = {k: k for k in REQUEST_SERIES}
DEVICES = {k: k for k in DEVICE_SERIES}
FOREVER = (0.0, math.inf)
# rule label -> vLLM metric label for a specwatch signal's vLLM equivalent: vLLM serves one drafter and
# mode, so those labels drop
AS_VLLM = {"instance": "instance", "model": "model_name", "drafter": None, "mode": None}
VLLM = {"source": "instance", "model": "model_name"}
INSTANCE_MODEL = {"instance": "instance", "model": "model"}
INSTANCE_MODEL_SERIES = {"instance": "gpu-0", "model": "smollm2-135m"}


def acceptance_series(accepted: str, drafted: str, requests: str) -> Callable[[Series], list[dict]]:
    """Accepted / drafted counters at the test value, and the requests behind them."""
    return lambda s: [*acceptance(s, accepted, drafted), s.counter(requests, s.per_window)]


def histogram_series(metric: str, requests: str | None = None) -> Callable[[Series], list[dict]]:
    """A histogram whose P99 is the test value (and a request counter when the count reads another metric)."""
    return lambda s: histogram(metric, s) + ([s.counter(requests, s.per_window)] if requests else [])


def gauge_series(metric: str, values: Callable[[float], list[float]]) -> Callable[[Series], list[dict]]:
    """A gauge cycling through `values(test value)`, present in the last `per_window` samples."""
    return lambda s: [s.gauge(metric, values(s.value), int(s.per_window))]
