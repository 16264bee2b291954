"""How each alert signal is computed from the store: one `Reading` per label set.

Request signals come in two forms: from raw rows (`collector.reads.reads`) and from the per-second window
aggregates written at ingest (through a `collector.reads.window_signals.WindowReader`: exact counts and
acceptance, TTFT P99 from a DDSketch within 1%). Every sample carries `count`, the number of
observations behind the value, which a rule's `min_samples` checks (no alert from 3 requests).
`alerts.signals` pairs each of these with its PromQL.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

import numpy as np
from sqlalchemy import Engine

from specwatch.alerts.detector_store import series_rows
from specwatch.collector.ingest.vllm import vllm_signals
from specwatch.collector.reads import reads
from specwatch.collector.reads.acceptance_definitions import first_position_counts
from specwatch.collector.reads.acceptance_modes import flagged_instances
from specwatch.collector.reads.queries import Window
from specwatch.collector.reads.speculation import is_inactive, recent, record_counts, speculation_activity
from specwatch.collector.reads.window_signals import WindowReader
from specwatch.collector.tiers import sketch
from specwatch.collector.tiers.aggregates import LABELS
from specwatch.cost.signals import excess_ratio
from specwatch.telemetry.ratios import drafted_step_fraction as drafted_step_fraction_of

Labels = tuple[tuple[str, str], ...]  # sorted (name, value) pairs


@dataclass(frozen=True)
class Reading:
    labels: Labels
    value: float
    count: int
    significant: bool = True  # False: a statistical test did not confirm the value
    annotations: Labels = ()  # extra annotations for the alert (a detector's before/after, its marker)


def _labels(names: Sequence[str], values: Sequence[object]) -> Labels:
    return tuple(sorted((n, "none" if v is None else str(v)) for n, v in zip(names, values)))


def _per_drafting_group(db: Engine, window: Window, group_by: Sequence[str], reduce) -> list[Reading]:
    """`reduce(drafted, accepted)` per label set, over the requests that drafted."""
    samples = []
    for g in reads.request_values(db, window, group_by, ("num_draft_tokens", "num_accepted_tokens")):
        drafted = g.values[g.values[:, 0] > 0]
        if len(drafted):
            samples.append(Reading(_labels(group_by, g.key), float(reduce(drafted[:, 0], drafted[:, 1])), len(drafted)))
    return samples


def acceptance_rate(db: Engine, window: Window, group_by: Sequence[str]) -> list[Reading]:
    """Accepted / drafted tokens over the window (vLLM's definition), requests that drafted."""
    found = _per_drafting_group(db, window, group_by, lambda drafted, accepted: accepted.sum() / drafted.sum())
    return _unless_inactive(found, _inactive(db, window, group_by), _flagged(db, window))


def acceptance_stddev(db: Engine, window: Window, group_by: Sequence[str]) -> list[Reading]:
    """Standard deviation across requests of each request's acceptance rate."""
    found = _per_drafting_group(db, window, group_by, lambda drafted, accepted: np.std(accepted / drafted))
    return _unless_inactive(found, _inactive(db, window, group_by), _flagged(db, window))


def conditional_acceptance(db: Engine, window: Window, group_by: Sequence[str]) -> list[Reading]:
    """Drafts whose first token was accepted / drafts, over requests that drafted (position 0: the same
    meaning at every k, where the mean falls as k grows); count: those requests."""
    found = [
        Reading(_labels(group_by, key), first / drafts, n)
        for key, (drafts, first, n) in first_position_counts(db, window, group_by).items()
    ]
    return _unless_inactive(found, _inactive(db, window, group_by), _flagged(db, window))


def _unless_inactive(readings: list[Reading], inactive: set[Labels], flagged: dict[str, str]) -> list[Reading]:
    """Acceptance that says nothing about the drafter is marked not significant, so it neither fires nor holds
    an alert: stale (the label set's speculative requests mostly did not draft: collector.reads.speculation)
    or from an instance whose config makes acceptance lossy or forced (collector.reads.acceptance_modes)."""

    def skipped(r: Reading) -> bool:
        return r.labels in inactive or dict(r.labels).get("instance") in flagged

    return [replace(r, significant=False) if skipped(r) else r for r in readings]


def _flagged(db: Engine, window: Window, reader: WindowReader | None = None) -> dict[str, str]:
    memo = {} if reader is None else reader.memo
    key = ("acceptance_modes", window.end)
    if key not in memo:
        memo[key] = flagged_instances(db, window.end)
    return memo[key]


def _inactive(db: Engine, window: Window, group_by: Sequence[str], reader: WindowReader | None = None) -> set[Labels]:
    """Label sets whose speculative requests (with known draft counts) say speculation is inactive now
    (over the window's last `speculation.RECENT_S`); read once per alert cycle when a reader is shared."""
    span = recent(window)
    memo = {} if reader is None else reader.memo
    key = ("speculation", span.start, span.end)
    if key not in memo:
        memo[key] = record_counts(db, span, LABELS)
    counts = memo[key]
    found: dict[tuple, np.ndarray] = defaultdict(lambda: np.zeros(3))
    for full, values in counts.items():
        found[tuple(full[LABELS.index(g)] for g in group_by)] += values
    return {
        _labels(group_by, key)
        for key, (output, drafts, accepted) in found.items()
        if is_inactive(drafts, accepted, output)
    }


def drafted_step_fraction(db: Engine, window: Window, group_by: Sequence[str]) -> list[Reading]:
    """Per instance configured to speculate (or over all of them), the share of decode steps that drafted
    (count: the decode steps; annotation: when it last drafted); no decode step in the window, no reading."""
    found = [a for a in speculation_activity(db, window) if a.drafted_step_fraction is not None]
    if group_by:
        return [_fraction_reading(group_by, (a.instance,), [a]) for a in found]
    return [_fraction_reading(group_by, (), found)] if found else []


def _fraction_reading(group_by: Sequence[str], key: tuple, activities: list) -> Reading:
    drafts, accepted, generated = (
        sum(getattr(a, f) for a in activities) for f in ("drafts", "accepted_tokens", "generated_tokens")
    )
    last = max((a.last_drafted_at for a in activities if a.last_drafted_at is not None), default=None)
    annotations = (("last_drafted_at", "none" if last is None else f"{last:.0f}"),)
    fraction = drafted_step_fraction_of(drafts, accepted, generated) or 0.0
    return Reading(_labels(group_by, key), fraction, int(generated - accepted), True, annotations)


def ttft_p99(db: Engine, window: Window, group_by: Sequence[str]) -> list[Reading]:
    """99th percentile of time to first token (seconds), exact over the window's requests."""
    samples = []
    for g in reads.request_values(db, window, group_by, ("ttft_s",)):
        ttft = g.values[:, 0][~np.isnan(g.values[:, 0])]
        if len(ttft):
            samples.append(Reading(_labels(group_by, g.key), float(np.quantile(ttft, 0.99)), len(ttft)))
    return samples


def _from_aggregates(group_by: Sequence[str], totals: dict, value, count) -> list[Reading]:
    """`value(totals)` per label set where `count(totals)` > 0."""
    return [
        Reading(_labels(group_by, key), float(value(t)), int(count(t))) for key, t in totals.items() if count(t) > 0
    ]


def acceptance_rate_aggregated(reader: WindowReader, window: Window, group_by: Sequence[str]) -> list[Reading]:
    """`acceptance_rate` from the aggregates (requests that did not draft add 0 to both sums)."""
    totals = reader.totals(window.start, group_by, with_sketches=())
    found = _from_aggregates(
        group_by, totals, lambda t: t.sums["accepted_tokens"] / t.sums["draft_tokens"], lambda t: t.sums["rate_n"]
    )
    return _unless_inactive(found, _inactive(reader.db, window, group_by, reader), _flagged(reader.db, window, reader))


def acceptance_stddev_aggregated(reader: WindowReader, window: Window, group_by: Sequence[str]) -> list[Reading]:
    """`acceptance_stddev` from the aggregates' merged (n, sum, M2) of per-request acceptance."""
    totals = reader.totals(window.start, group_by, with_sketches=())
    found = _from_aggregates(group_by, totals, lambda t: t.acceptance_stddev(), lambda t: t.sums["rate_n"])
    return _unless_inactive(found, _inactive(reader.db, window, group_by, reader), _flagged(reader.db, window, reader))


def ttft_p99_aggregated(reader: WindowReader, window: Window, group_by: Sequence[str]) -> list[Reading]:
    """P99 TTFT from the merged DDSketches: within 1% of the value at that rank."""
    totals = reader.totals(window.start, group_by, with_sketches=("ttft",))
    ttft = {key: t.sketches["ttft"] for key, t in totals.items()}
    return [
        Reading(_labels(group_by, key), sketch.quantile(bins, 0.99), bins.count)
        for key, bins in ttft.items()
        if bins.count
    ]


def spec_latency_regression(db: Engine, window: Window, group_by: Sequence[str]) -> list[Reading]:
    """Relative excess of the spec arm's mean e2e latency per output token over the control
    arm's (0.1 = 10% slower), significant when a one-sided Mann-Whitney U gives p < 0.05."""
    from scipy.stats import mannwhitneyu

    samples = []
    for g in reads.arm_latency(db, window, group_by):
        spec, control = g.spec, g.control
        if len(spec) and len(control):
            p = mannwhitneyu(spec, control, alternative="greater").pvalue if min(len(spec), len(control)) > 1 else 1.0
            excess = float(spec.mean() / control.mean() - 1.0)
            samples.append(Reading(_labels(group_by, g.key), excess, min(len(spec), len(control)), bool(p < 0.05)))
    return samples


def spec_latency_regression_aggregated(reader: WindowReader, window: Window, group_by: Sequence[str]) -> list[Reading]:
    """`spec_latency_regression`, reading raw rows only when the aggregates show A/B arm traffic in the
    window (the rank test needs every value; without arms it has nothing to compare)."""
    arms = reader.totals(window.start, ("arm",), with_sketches=())
    if all(arm is None for (arm,) in arms):
        return []
    return spec_latency_regression(reader.db, window, group_by)


Modes = dict[tuple, dict[str, tuple[float, float, int]]]  # label values -> mode -> (device s, output tokens, requests)


def spec_cost_excess(db: Engine, window: Window, group_by: Sequence[str]) -> list[Reading]:
    """Relative extra compute cost of speculative decoding: the speculative mode's device seconds
    per output token over plain (autoregressive) decoding's, minus 1 (0.1 = 10% dearer).

    Both modes run on the same instance at the same $ per device-second, so the ratio of device
    seconds per token is the ratio of compute cost per token. The draft's memory share and energy
    are left out here; the cost report (cost/) prices them. Only ok requests with output that
    carry `device_s` count (producers that cannot attribute device time send none); the count is
    the smaller mode's request count, so `min_samples` asks for enough requests in both.
    """
    modes: Modes = defaultdict(dict)
    for m in reads.device_time_by_mode(db, window, group_by):
        modes[m.key][m.mode] = (m.device_s, m.output_tokens, m.requests)
    return _cost_samples(group_by, modes)


def spec_cost_excess_aggregated(reader: WindowReader, window: Window, group_by: Sequence[str]) -> list[Reading]:
    """`spec_cost_excess` from the aggregates' per-mode sums over ok requests with output and device_s."""
    totals = reader.totals(window.start, (*group_by, "mode"), with_sketches=())
    modes: Modes = defaultdict(dict)
    for (*key, mode), t in totals.items():
        if t.sums["cost_requests"]:
            sums = t.sums
            modes[tuple(key)][mode] = (sums["cost_device_s"], sums["cost_output_tokens"], int(sums["cost_requests"]))
    return _cost_samples(group_by, modes)


def _cost_samples(group_by: Sequence[str], modes: Modes) -> list[Reading]:
    """(device seconds, output tokens, requests) per mode -> the cost model's excess ratio per label set."""
    samples = []
    for key, per_mode in modes.items():
        spec, plain = per_mode.get("speculative"), per_mode.get("autoregressive")
        ratio = excess_ratio(*spec[:2], *plain[:2]) if spec and plain else None
        if ratio is not None:
            samples.append(Reading(_labels(group_by, key), ratio, min(spec[2], plain[2])))
    return samples


def oom_count(db: Engine, window: Window, group_by: Sequence[str]) -> list[Reading]:
    """Out-of-memory failures: requests that failed with an OOM or `oom` engine events, whichever
    count is larger (the engine may report one OOM both ways)."""
    found = reads.oom_counts(db, window)
    return _oom_samples(group_by, found.from_requests, found.from_events)


def oom_count_aggregated(reader: WindowReader, window: Window, group_by: Sequence[str]) -> list[Reading]:
    """`oom_count` with the requests' OOM counts from the aggregates (engine events stay raw: few)."""
    totals = reader.totals(window.start, ("instance",), with_sketches=())
    from_requests = {key[0]: int(t.sums["ooms"]) for key, t in totals.items() if t.sums["ooms"]}
    return _oom_samples(group_by, from_requests, reads.oom_events(reader.db, window))


def _oom_samples(group_by: Sequence[str], from_requests: dict, from_events: dict) -> list[Reading]:
    counts: dict[tuple, int] = defaultdict(int)
    for instance in from_requests.keys() | from_events.keys():
        key = (instance,) if group_by else ()
        counts[key] += max(from_requests.get(instance, 0), from_events.get(instance, 0))
    return [Reading(_labels(group_by, key), float(n), n) for key, n in counts.items()]


def _per_device(db: Engine, window: Window, group_by: Sequence[str], column: str, reduce) -> list[Reading]:
    groups = reads.device_values(db, window, group_by, column)
    return [Reading(_labels(group_by, g.key), float(reduce(g.values[:, 0])), len(g.values)) for g in groups]


def fragmentation(db: Engine, window: Window, group_by: Sequence[str]) -> list[Reading]:
    """Mean fragmentation index (reserved / allocated memory) of the window's device samples."""
    return _per_device(db, window, group_by, "fragmentation", np.mean)


def draft_util_swing(db: Engine, window: Window, group_by: Sequence[str]) -> list[Reading]:
    """Max - min of the draft's busy fraction over the window, in percentage points."""
    return _per_device(db, window, group_by, "util_draft", lambda v: np.ptp(v) * 100.0)


def vllm(pick: Callable, acceptance: bool = False) -> Callable[[Engine, Window, Sequence[str]], list[Reading]]:
    """A signal over scraped vLLM metrics: `pick(VllmSignals)` per (source, model) scraped in the window.
    `acceptance`: the value is stale, so not significant, where the source speculates but mostly stopped
    drafting."""

    def compute(db: Engine, window: Window, group_by: Sequence[str]) -> list[Reading]:
        samples = []
        for key in reads.vllm_keys(db, window, group_by):
            found = vllm_signals(db, window, **dict(zip(group_by, key)))
            if (value := pick(found)) is not None:
                stale = acceptance and _stale_vllm(db, window, dict(zip(group_by, key)))
                samples.append(Reading(_labels(group_by, key), float(value), found.e2e.count, not stale))
        return samples

    return compute


def _stale_vllm(db: Engine, window: Window, key: dict) -> bool:
    """A speculating vLLM source that stopped drafting (over the window's last `speculation.RECENT_S`):
    its acceptance is the last drafts' figure."""
    now = vllm_signals(db, recent(window), **key)
    return now.speculating and is_inactive(now.drafts, now.accepted_tokens, now.generation_tokens)


def detector(kind: str) -> Callable[[Engine, Window, Sequence[str]], list[Reading]]:
    """A change detector's output (`alerts.baselines`, `alerts.regression`): per label set, the largest
    value among its significant series updated in the window, with that series' annotations."""

    def compute(db: Engine, window: Window, group_by: Sequence[str]) -> list[Reading]:
        groups: dict[tuple, list] = defaultdict(list)
        for row in series_rows(db, kind, since=window.start):
            if row.significant and row.updated_at < window.end:
                groups[tuple(dict(row.labels).get(g, "none") for g in group_by)].append(row)
        return [_detector_sample(group_by, key, rows) for key, rows in groups.items()]

    return compute


def _detector_sample(group_by: Sequence[str], key: tuple, rows: list) -> Reading:
    top = max(rows, key=lambda r: r.value)
    count = sum(r.count for r in rows)
    return Reading(_labels(group_by, key), float(top.value), count, True, tuple(sorted(top.annotations.items())))
