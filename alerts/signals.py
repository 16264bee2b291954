"""What alert rules measure: one entry per named signal, its store computation and its PromQL together.

Each `Signal` holds the labels a rule may group by, its unit, how it is computed from the collector's
store (`alerts.measures`: from raw rows, and from the window aggregates where those cover it) and the
same signal in PromQL (`alerts.promql`), which the Prometheus rule export (`alerts.prometheus`) reads;
where PromQL cannot say the same, `promql_note` says what differs. `StoreSignals` is the evaluator's
source over the store; the evaluator only sees readings, so tests can feed it any values.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sqlalchemy import Engine

from specwatch.alerts import measures as m
from specwatch.alerts import promql as q
from specwatch.alerts.measures import Labels, Reading
from specwatch.collector.reads.queries import Window
from specwatch.collector.reads.window_signals import WindowReader

__all__ = ["DEFINITIONS", "SIGNALS", "Labels", "Reading", "Signal", "StoreSignals"]


@dataclass(frozen=True)
class Signal:
    labels: tuple[str, ...]  # what a rule may group by
    unit: str
    doc: str
    compute: Callable[[Engine, Window, Sequence[str]], list[Reading]]  # from raw rows
    promql: q.PromQL  # the same signal over the collector's (or vLLM's) /metrics
    # from the window aggregates, through a reader of windows ending at the window's end
    aggregated: Callable[[WindowReader, Window, Sequence[str]], list[Reading]] | None = None
    vllm_equivalent: str | None = None  # the signal over vLLM's native metrics, exported beside it
    promql_note: str = ""  # where the PromQL differs from the store's computation


REQUEST_LABELS = ("instance", "model", "drafter", "mode", "arm")
DEVICE_LABELS = ("instance", "device")
VLLM_LABELS = ("source", "model")
_TTFT = "specwatch_time_to_first_token_seconds"
_VLLM_REQUESTS = "vllm:e2e_request_latency_seconds_count"
_VLLM_ACCEPTED, _VLLM_DRAFTED = "vllm:spec_decode_num_accepted_tokens_total", "vllm:spec_decode_num_draft_tokens_total"
_ACCEPTANCE_N = "specwatch_acceptance_rate_requests_total"
DRIFT_LABELS = ("instance", "model", "drafter", "tag")
DRIFT_SERIES = {"instance": "gpu-0", "model": "smollm2-135m", "drafter": "ngram", "tag": "none"}
_DRIFT, _REGRESSION = "specwatch_acceptance_drift_score", "specwatch_acceptance_regression_drop"
_DRAFTED_STEPS = "specwatch_drafted_step_fraction"
_FIRST_ACCEPTED, _DRAFTS = "specwatch_first_position_accepted_total", "specwatch_drafts_total"
_VLLM_PER_POS, _VLLM_DRAFTS = "vllm:spec_decode_num_accepted_tokens_per_pos_total", "vllm:spec_decode_num_drafts_total"
_FRAGMENTATION, _UTIL_DRAFT = "specwatch_device_fragmentation_ratio", "specwatch_device_util_draft_ratio"

SIGNALS: dict[str, Signal] = {
    "acceptance_rate": Signal(
        REQUEST_LABELS,
        "ratio",
        "accepted / drafted tokens",
        m.acceptance_rate,
        q.PromQL(
            q.REQUESTS,
            q.REQUEST_SERIES,
            q.ratio("specwatch_accepted_tokens_total", "specwatch_draft_tokens_total"),
            q.increase(_ACCEPTANCE_N),
            q.acceptance_series("specwatch_accepted_tokens_total", "specwatch_draft_tokens_total", _ACCEPTANCE_N),
            (0.0, 1.0),
        ),
        m.acceptance_rate_aggregated,
        vllm_equivalent="vllm_acceptance_rate",
    ),
    "conditional_acceptance": Signal(  # another definition for the acceptance rules (docs/glossary.md)
        REQUEST_LABELS,
        "ratio",
        "drafts whose first token was accepted / drafts (position 0)",
        m.conditional_acceptance,
        q.PromQL(
            q.REQUESTS,
            q.REQUEST_SERIES,
            q.ratio(_FIRST_ACCEPTED, _DRAFTS),
            q.increase(_ACCEPTANCE_N),
            q.acceptance_series(_FIRST_ACCEPTED, _DRAFTS, _ACCEPTANCE_N),
            (0.0, 1.0),
        ),
        vllm_equivalent="vllm_conditional_acceptance",
    ),
    "acceptance_stddev": Signal(
        REQUEST_LABELS,
        "ratio",
        "stddev of per-request acceptance",
        m.acceptance_stddev,
        q.PromQL(q.REQUESTS, q.REQUEST_SERIES, q.stddev, q.increase(_ACCEPTANCE_N), q.moments, (0.0, 0.5)),
        m.acceptance_stddev_aggregated,
    ),
    "ttft_p99": Signal(
        REQUEST_LABELS,
        "seconds",
        "P99 time to first token",
        m.ttft_p99,
        q.PromQL(
            q.REQUESTS,
            q.REQUEST_SERIES,
            q.p99(_TTFT),
            q.increase(f"{_TTFT}_count"),
            q.histogram_series(_TTFT),
            q.FOREVER,
        ),
        m.ttft_p99_aggregated,
        vllm_equivalent="vllm_ttft_p99",
    ),
    "spec_latency_regression": Signal(
        ("instance", "model"),
        "ratio",
        "spec arm vs control arm latency per token - 1",
        m.spec_latency_regression,
        q.PromQL(q.INSTANCE_MODEL, q.INSTANCE_MODEL_SERIES, q.regression, q.fewest_arm, q.arms, (-1.0, math.inf)),
        m.spec_latency_regression_aggregated,
        promql_note="In Prometheus this is the ratio of the arms' mean latency per token only; specwatch's own "
        "evaluator also requires a one-sided Mann-Whitney U test (p < 0.05), which PromQL cannot do.",
    ),
    "spec_cost_excess": Signal(  # PromQL reads the device-time counters: the same ok requests with device_s
        ("instance", "model"),
        "ratio",
        "speculative vs plain device seconds per output token - 1",
        m.spec_cost_excess,
        q.PromQL(q.INSTANCE_MODEL, q.INSTANCE_MODEL_SERIES, q.cost_excess, q.fewest_mode, q.modes, (-1.0, math.inf)),
        m.spec_cost_excess_aggregated,
    ),
    "oom_count": Signal(
        ("instance",),
        "count",
        "out-of-memory failures",
        m.oom_count,
        q.PromQL(
            {"instance": "instance"},
            q.REQUEST_SERIES,
            q.increase("specwatch_oom_errors_total"),
            q.increase("specwatch_oom_errors_total"),
            lambda s: [s.counter("specwatch_oom_errors_total", s.value)],
            q.FOREVER,
            count_is_value=True,
        ),
        m.oom_count_aggregated,
    ),
    "fragmentation": Signal(  # PromQL counts scrapes where the store counts device samples
        DEVICE_LABELS,
        "ratio",
        "reserved / allocated memory",
        m.fragmentation,
        q.PromQL(
            q.DEVICES,
            q.DEVICE_SERIES,
            lambda by, w: f"avg by ({by}) (avg_over_time({_FRAGMENTATION}[{w}]))",
            q.scrapes(_FRAGMENTATION),
            q.gauge_series(_FRAGMENTATION, lambda v: [v]),
            q.FOREVER,
            gauge=True,
        ),
    ),
    "draft_util_swing": Signal(
        DEVICE_LABELS,
        "percentage points",
        "max - min draft utilisation",
        m.draft_util_swing,
        q.PromQL(
            q.DEVICES,
            q.DEVICE_SERIES,
            q.swing,
            q.scrapes(_UTIL_DRAFT),
            q.gauge_series(_UTIL_DRAFT, lambda v: [0.0, v / 100]),
            (0.0, 100.0),
            gauge=True,
        ),
    ),
    "acceptance_drift": Signal(  # alerts.drift's CUSUM score (>= 1: a detected drop), kept by the leader
        DRIFT_LABELS,
        "score",
        "CUSUM of per-request acceptance below the series' own baseline, over its decision interval",
        m.detector("drift"),
        q.PromQL(
            {k: k for k in DRIFT_LABELS},
            DRIFT_SERIES,
            lambda by, w: f"max by ({by}) (max_over_time({_DRIFT}[{w}]))",
            q.scrapes(_DRIFT),
            q.gauge_series(_DRIFT, lambda v: [v]),
            (0.0, math.inf),
            gauge=True,
        ),
        promql_note="The score is computed by the collector's leader (alerts.baselines) and exported as a gauge; "
        "the store's count is the series' requests since its baseline started, PromQL's the scrapes.",
    ),
    "acceptance_regression": Signal(  # alerts.regression: relative drop at an instance's latest deploy marker
        ("instance", "model", "marker"),
        "ratio",
        "1 - acceptance after / before the instance's latest config marker",
        m.detector("regression"),
        q.PromQL(
            {"instance": "instance", "model": "model", "marker": "marker"},
            {"instance": "gpu-0", "model": "smollm2-135m", "marker": "2026-12-01T10:00:00Z"},
            lambda by, w: f"max by ({by}) (max_over_time({_REGRESSION}[{w}]))",
            q.scrapes(_REGRESSION),
            q.gauge_series(_REGRESSION, lambda v: [v]),
            (-math.inf, 1.0),
            gauge=True,
        ),
        promql_note="The gauge carries only drops a one-sided Mann-Whitney U test confirmed (p < alpha); the "
        "store's count is the smaller side's requests, PromQL's the scrapes.",
    ),
    "drafted_step_fraction": Signal(  # collector.reads.speculation: is speculation drafting at all?
        ("instance",),
        "ratio",
        "drafts / decode steps of an instance configured to speculate",
        m.drafted_step_fraction,
        q.PromQL(
            {"instance": "instance"},
            {"instance": "gpu-0"},
            lambda by, w: f"avg by ({by}) (avg_over_time({_DRAFTED_STEPS}[{w}]))",
            q.scrapes(_DRAFTED_STEPS),
            q.gauge_series(_DRAFTED_STEPS, lambda v: [v]),
            (0.0, 1.0),
            gauge=True,
        ),
        promql_note="The collector exports the fraction over its own speculation window "
        "(SPECWATCH_SPECULATION_WINDOW_S) as a gauge; the store's count is the decode steps, PromQL's the scrapes.",
    ),
    "vllm_acceptance_rate": Signal(
        VLLM_LABELS,
        "ratio",
        "vLLM accepted / drafted tokens",
        m.vllm(lambda s: s.acceptance_rate, acceptance=True),
        q.PromQL(
            q.VLLM,
            q.VLLM_SERIES,
            q.ratio(_VLLM_ACCEPTED, _VLLM_DRAFTED),
            q.increase(_VLLM_REQUESTS),
            q.acceptance_series(_VLLM_ACCEPTED, _VLLM_DRAFTED, _VLLM_REQUESTS),
            (0.0, 1.0),
        ),
    ),
    "vllm_conditional_acceptance": Signal(
        VLLM_LABELS,
        "ratio",
        "vLLM drafts whose first token was accepted / drafts (position 0)",
        m.vllm(lambda s: s.conditional_acceptance, acceptance=True),
        q.PromQL(
            q.VLLM,
            q.VLLM_SERIES,
            q.ratio(_VLLM_PER_POS + '{position="0"}', _VLLM_DRAFTS),
            q.increase(_VLLM_REQUESTS),
            lambda s: [
                s.counter(_VLLM_PER_POS, 100 * s.value, position="0"),
                s.counter(_VLLM_DRAFTS, 100),
                s.counter(_VLLM_REQUESTS, s.per_window),
            ],
            (0.0, 1.0),
        ),
    ),
    "vllm_ttft_p99": Signal(
        VLLM_LABELS,
        "seconds",
        "vLLM P99 time to first token",
        m.vllm(lambda s: s.ttft.p99),
        q.PromQL(
            q.VLLM,
            q.VLLM_SERIES,
            q.p99("vllm:time_to_first_token_seconds"),
            q.increase(_VLLM_REQUESTS),
            q.histogram_series("vllm:time_to_first_token_seconds", _VLLM_REQUESTS),
            q.FOREVER,
        ),
    ),
}


# Which acceptance definition each acceptance signal's threshold applies to: the glossary's term
# (docs/glossary.md, "which definition each threshold uses"), shown beside each rule on the Acceptance page.
MEAN = "acceptance rate (the mean: accepted / drafted tokens)"
POSITION_0 = "conditional acceptance (position 0: drafts whose first token was accepted / drafts)"
DEFINITIONS: dict[str, str] = {
    "acceptance_rate": MEAN,
    "vllm_acceptance_rate": MEAN + ", over vLLM's counters",
    "conditional_acceptance": POSITION_0,
    "vllm_conditional_acceptance": POSITION_0 + ", over vLLM's counters",
    "acceptance_stddev": "the standard deviation of per-request acceptance rates",
    "acceptance_drift": "per-request acceptance rates (a CUSUM score over them)",
    "acceptance_regression": "per-request acceptance rates (the relative drop at a deploy marker)",
    "drafted_step_fraction": "drafted step fraction (not an acceptance: whether drafting happens at all)",
}


class StoreSignals:
    """The signal source over the collector's database. Request signals read the window aggregates
    (`Signal.aggregated`); `raw=True` reads raw rows instead (for comparison: bench/alerts.py).

    Each query reads the store afresh. `cycle(now)` gives a source for one alert cycle: its queries
    at `now` share one `WindowReader`, so the aggregate rows and raw partial seconds that several
    signals, windows and group-bys need are read once per cycle (what a cycle sees is the store
    as of those first reads).
    """

    def __init__(self, db: Engine, raw: bool = False, reader: WindowReader | None = None) -> None:
        self.db = db
        self.raw = raw
        self.reader = reader

    def cycle(self, now: float) -> StoreSignals:
        return StoreSignals(self.db, self.raw, WindowReader(self.db, now))

    def query(self, signal: str, window_s: float, group_by: Sequence[str], now: float) -> list[Reading]:
        spec, window = SIGNALS[signal], Window(now - window_s, now)
        if self.raw or spec.aggregated is None:
            return spec.compute(self.db, window, group_by)
        shared = self.reader is not None and self.reader.end == now
        return spec.aggregated(self.reader if shared else WindowReader(self.db, now), window, group_by)
