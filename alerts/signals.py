"""What alert rules measure: named signals over a time window, one `Sample` per label set.

`StoreSignals` reads the collector's store (per-request telemetry, device samples, engine
events and scraped vLLM metrics) through SQLAlchemy; request signals merge the per-second
aggregates written at ingest (`collector.window_signals`: exact counts and acceptance, TTFT P99
from a DDSketch within 1%), and `StoreSignals(engine, raw=True)` reads raw rows instead.
The evaluator only sees the samples, so tests can feed it any values. Every sample carries
`count`, the number of observations behind the value, which a rule's `min_samples` checks (no alert from 3 requests).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from sqlalchemy import Engine, func, select

from collector import sketch
from collector.models import DeviceSampleRow, EngineEventRow, Request, VllmScrape
from collector.queries import Window
from collector.vllm import vllm_signals
from collector.window_signals import WindowReader

Labels = tuple[tuple[str, str], ...]  # sorted (name, value) pairs


@dataclass(frozen=True)
class Sample:
    labels: Labels
    value: float
    count: int
    significant: bool = True  # False: a statistical test did not confirm the value


@dataclass(frozen=True)
class Signal:
    labels: tuple[str, ...]  # what a rule may group by
    unit: str
    doc: str
    compute: Callable[[Engine, Window, Sequence[str]], list[Sample]]  # from raw rows
    # from the window aggregates, through a reader of windows ending at the window's end
    aggregated: Callable[[WindowReader, Window, Sequence[str]], list[Sample]] | None = None


REQUEST_LABELS = ("instance", "model", "drafter", "mode", "arm")
DEVICE_LABELS = ("instance", "device")
VLLM_LABELS = ("source", "model")


def _labels(names: Sequence[str], values: Sequence[object]) -> Labels:
    return tuple(sorted((n, "none" if v is None else str(v)) for n, v in zip(names, values)))


def _grouped(rows: Sequence[tuple], k: int) -> dict[Labels, np.ndarray]:
    """Rows whose first k columns are labels -> {label values: float array of the rest}."""
    groups: dict[tuple, list[tuple]] = defaultdict(list)
    for row in rows:
        groups[tuple(row[:k])].append(row[k:])
    return {key: np.array(values, dtype=float) for key, values in groups.items()}


def _request_columns(engine: Engine, window: Window, group_by: Sequence[str], *columns) -> dict[tuple, np.ndarray]:
    stmt = select(*(getattr(Request, g) for g in group_by), *columns).where(
        Request.started_at >= window.start, Request.started_at < window.end
    )
    with engine.connect() as conn:
        return _grouped(conn.execute(stmt).all(), len(group_by))


def _per_drafting_group(engine: Engine, window: Window, group_by: Sequence[str], reduce) -> list[Sample]:
    """`reduce(drafted, accepted)` per label set, over the requests that drafted."""
    groups = _request_columns(engine, window, group_by, Request.num_draft_tokens, Request.num_accepted_tokens)
    samples = []
    for key, values in groups.items():
        drafted = values[values[:, 0] > 0]
        if len(drafted):
            samples.append(Sample(_labels(group_by, key), float(reduce(drafted[:, 0], drafted[:, 1])), len(drafted)))
    return samples


def acceptance_rate(engine: Engine, window: Window, group_by: Sequence[str]) -> list[Sample]:
    """Accepted / drafted tokens over the window (vLLM's definition), requests that drafted."""
    return _per_drafting_group(engine, window, group_by, lambda drafted, accepted: accepted.sum() / drafted.sum())


def acceptance_stddev(engine: Engine, window: Window, group_by: Sequence[str]) -> list[Sample]:
    """Standard deviation across requests of each request's acceptance rate."""
    return _per_drafting_group(engine, window, group_by, lambda drafted, accepted: np.std(accepted / drafted))


def ttft_p99(engine: Engine, window: Window, group_by: Sequence[str]) -> list[Sample]:
    """99th percentile of time to first token (seconds), exact over the window's requests."""
    samples = []
    for key, values in _request_columns(engine, window, group_by, Request.ttft_s).items():
        ttft = values[:, 0][~np.isnan(values[:, 0])]
        if len(ttft):
            samples.append(Sample(_labels(group_by, key), float(np.quantile(ttft, 0.99)), len(ttft)))
    return samples


def _from_aggregates(group_by: Sequence[str], totals: dict, value, count) -> list[Sample]:
    """`value(totals)` per label set where `count(totals)` > 0."""
    return [Sample(_labels(group_by, key), float(value(t)), int(count(t))) for key, t in totals.items() if count(t) > 0]


def acceptance_rate_aggregated(reader: WindowReader, window: Window, group_by: Sequence[str]) -> list[Sample]:
    """`acceptance_rate` from the aggregates (requests that did not draft add 0 to both sums)."""
    totals = reader.totals(window.start, group_by, with_sketches=())
    return _from_aggregates(
        group_by, totals, lambda t: t.sums["accepted_tokens"] / t.sums["draft_tokens"], lambda t: t.sums["rate_n"]
    )


def acceptance_stddev_aggregated(reader: WindowReader, window: Window, group_by: Sequence[str]) -> list[Sample]:
    """`acceptance_stddev` from the aggregates' merged (n, sum, M2) of per-request acceptance."""
    totals = reader.totals(window.start, group_by, with_sketches=())
    return _from_aggregates(group_by, totals, lambda t: t.acceptance_stddev(), lambda t: t.sums["rate_n"])


def ttft_p99_aggregated(reader: WindowReader, window: Window, group_by: Sequence[str]) -> list[Sample]:
    """P99 TTFT from the merged DDSketches: within 1% of the value at that rank."""
    totals = reader.totals(window.start, group_by, with_sketches=("ttft",))
    ttft = {key: t.sketches["ttft"] for key, t in totals.items()}
    return [
        Sample(_labels(group_by, key), sketch.quantile(bins, 0.99), bins.count)
        for key, bins in ttft.items()
        if bins.count
    ]


def spec_latency_regression(engine: Engine, window: Window, group_by: Sequence[str]) -> list[Sample]:
    """Relative excess of the spec arm's mean e2e latency per output token over the control
    arm's (0.1 = 10% slower), significant when a one-sided Mann-Whitney U gives p < 0.05."""
    from scipy.stats import mannwhitneyu

    per_token = Request.e2e_s / Request.output_tokens
    stmt_filter = (Request.arm.is_not(None), Request.status == "ok", Request.output_tokens > 0)
    stmt = select(*(getattr(Request, g) for g in group_by), Request.arm, per_token).where(
        Request.started_at >= window.start, Request.started_at < window.end, *stmt_filter
    )
    with engine.connect() as conn:
        rows = conn.execute(stmt).all()
    k = len(group_by)
    arms: dict[tuple, dict[str, list[float]]] = defaultdict(lambda: {"spec": [], "control": []})
    for row in rows:
        arms[tuple(row[:k])][row[k]].append(float(row[k + 1]))
    samples = []
    for key, arm in arms.items():
        spec, control = np.array(arm["spec"]), np.array(arm["control"])
        if len(spec) and len(control):
            p = mannwhitneyu(spec, control, alternative="greater").pvalue if min(len(spec), len(control)) > 1 else 1.0
            excess = float(spec.mean() / control.mean() - 1.0)
            samples.append(Sample(_labels(group_by, key), excess, min(len(spec), len(control)), bool(p < 0.05)))
    return samples


def spec_latency_regression_aggregated(reader: WindowReader, window: Window, group_by: Sequence[str]) -> list[Sample]:
    """`spec_latency_regression`, reading raw rows only when the aggregates show A/B arm traffic in the
    window (the rank test needs every value; without arms it has nothing to compare)."""
    arms = reader.totals(window.start, ("arm",), with_sketches=())
    if all(arm is None for (arm,) in arms):
        return []
    return spec_latency_regression(reader.engine, window, group_by)


def spec_cost_excess(engine: Engine, window: Window, group_by: Sequence[str]) -> list[Sample]:
    """Relative extra compute cost of speculative decoding: the speculative mode's device seconds
    per output token over plain (autoregressive) decoding's, minus 1 (0.1 = 10% dearer).

    Both modes run on the same instance at the same $ per device-second, so the ratio of device
    seconds per token is the ratio of compute cost per token. The draft's memory share and energy
    are left out here; the cost report (cost/) prices them. Only ok requests with output that
    carry `device_s` count (producers that cannot attribute device time send none); the count is
    the smaller mode's request count, so `min_samples` asks for enough requests in both.
    """
    stmt = (
        select(
            *(getattr(Request, g) for g in group_by),
            Request.mode,
            func.sum(Request.device_s),
            func.sum(Request.output_tokens),
            func.count(),
        )
        .where(
            Request.started_at >= window.start,
            Request.started_at < window.end,
            Request.status == "ok",
            Request.output_tokens > 0,
            Request.device_s.is_not(None),
        )
        .group_by(*(getattr(Request, g) for g in group_by), Request.mode)
    )
    with engine.connect() as conn:
        rows = conn.execute(stmt).all()
    k = len(group_by)
    modes: dict[tuple, dict[str, tuple[float, int]]] = defaultdict(dict)
    for row in rows:
        device_s, tokens, requests = row[k + 1 :]
        modes[tuple(row[:k])][row[k]] = (float(device_s) / float(tokens), int(requests))
    return _cost_samples(group_by, modes)


def spec_cost_excess_aggregated(reader: WindowReader, window: Window, group_by: Sequence[str]) -> list[Sample]:
    """`spec_cost_excess` from the aggregates' per-mode sums over ok requests with output and device_s."""
    totals = reader.totals(window.start, (*group_by, "mode"), with_sketches=())
    modes: dict[tuple, dict[str, tuple[float, int]]] = defaultdict(dict)
    for (*key, mode), t in totals.items():
        if t.sums["cost_requests"]:
            per_token = t.sums["cost_device_s"] / t.sums["cost_output_tokens"]
            modes[tuple(key)][mode] = (per_token, int(t.sums["cost_requests"]))
    return _cost_samples(group_by, modes)


def _cost_samples(group_by: Sequence[str], modes: dict[tuple, dict[str, tuple[float, int]]]) -> list[Sample]:
    """(device seconds per output token, requests) per mode -> speculative / plain - 1 per label set."""
    samples = []
    for key, per_mode in modes.items():
        spec, plain = per_mode.get("speculative"), per_mode.get("autoregressive")
        if spec and plain and plain[0] > 0:
            samples.append(Sample(_labels(group_by, key), spec[0] / plain[0] - 1.0, min(spec[1], plain[1])))
    return samples


def oom_count(engine: Engine, window: Window, group_by: Sequence[str]) -> list[Sample]:
    """Out-of-memory failures: requests that failed with an OOM or `oom` engine events, whichever
    count is larger (the engine may report one OOM both ways)."""
    requests = (
        select(Request.instance, func.count())
        .where(
            Request.started_at >= window.start,
            Request.started_at < window.end,
            Request.error.like("%oom%"),
        )
        .group_by(Request.instance)
    )
    events = (
        select(EngineEventRow.instance, func.count())
        .where(
            EngineEventRow.at >= window.start,
            EngineEventRow.at < window.end,
            EngineEventRow.kind == "oom",
        )
        .group_by(EngineEventRow.instance)
    )
    with engine.connect() as conn:
        from_requests, from_events = dict(conn.execute(requests).all()), dict(conn.execute(events).all())
    return _oom_samples(group_by, from_requests, from_events)


def oom_count_aggregated(reader: WindowReader, window: Window, group_by: Sequence[str]) -> list[Sample]:
    """`oom_count` with the requests' OOM counts from the aggregates (engine events stay raw: few)."""
    totals = reader.totals(window.start, ("instance",), with_sketches=())
    from_requests = {key[0]: int(t.sums["ooms"]) for key, t in totals.items() if t.sums["ooms"]}
    events = (
        select(EngineEventRow.instance, func.count())
        .where(EngineEventRow.at >= window.start, EngineEventRow.at < window.end, EngineEventRow.kind == "oom")
        .group_by(EngineEventRow.instance)
    )
    with reader.engine.connect() as conn:
        from_events = dict(conn.execute(events).all())
    return _oom_samples(group_by, from_requests, from_events)


def _oom_samples(group_by: Sequence[str], from_requests: dict, from_events: dict) -> list[Sample]:
    counts: dict[tuple, int] = defaultdict(int)
    for instance in from_requests.keys() | from_events.keys():
        key = (instance,) if group_by else ()
        counts[key] += max(from_requests.get(instance, 0), from_events.get(instance, 0))
    return [Sample(_labels(group_by, key), float(n), n) for key, n in counts.items()]


def _device_values(engine: Engine, window: Window, group_by: Sequence[str], column) -> dict[tuple, np.ndarray]:
    stmt = select(*(getattr(DeviceSampleRow, g) for g in group_by), column).where(
        DeviceSampleRow.at >= window.start, DeviceSampleRow.at < window.end, column.is_not(None)
    )
    with engine.connect() as conn:
        return {key: values[:, 0] for key, values in _grouped(conn.execute(stmt).all(), len(group_by)).items()}


def fragmentation(engine: Engine, window: Window, group_by: Sequence[str]) -> list[Sample]:
    """Mean fragmentation index (reserved / allocated memory) of the window's device samples."""
    groups = _device_values(engine, window, group_by, DeviceSampleRow.fragmentation)
    return [Sample(_labels(group_by, key), float(v.mean()), len(v)) for key, v in groups.items()]


def draft_util_swing(engine: Engine, window: Window, group_by: Sequence[str]) -> list[Sample]:
    """Max - min of the draft's busy fraction over the window, in percentage points."""
    groups = _device_values(engine, window, group_by, DeviceSampleRow.util_draft)
    return [Sample(_labels(group_by, key), float(np.ptp(v) * 100.0), len(v)) for key, v in groups.items()]


def _vllm(pick: Callable) -> Callable[[Engine, Window, Sequence[str]], list[Sample]]:
    def compute(engine: Engine, window: Window, group_by: Sequence[str]) -> list[Sample]:
        stmt = (
            select(*(getattr(VllmScrape, g) for g in group_by))
            .where(VllmScrape.at >= window.start, VllmScrape.at < window.end)
            .distinct()
        )
        with engine.connect() as conn:
            keys = conn.execute(stmt).all()
        samples = []
        for key in keys:
            found = vllm_signals(engine, window, **dict(zip(group_by, key)))
            value = pick(found)
            if value is not None:
                samples.append(Sample(_labels(group_by, key), float(value), found.e2e.count))
        return samples

    return compute


SIGNALS: dict[str, Signal] = {
    "acceptance_rate": Signal(
        REQUEST_LABELS, "ratio", "accepted / drafted tokens", acceptance_rate, acceptance_rate_aggregated
    ),
    "acceptance_stddev": Signal(
        REQUEST_LABELS,
        "ratio",
        "stddev of per-request acceptance",
        acceptance_stddev,
        acceptance_stddev_aggregated,
    ),
    "ttft_p99": Signal(REQUEST_LABELS, "seconds", "P99 time to first token", ttft_p99, ttft_p99_aggregated),
    "spec_latency_regression": Signal(
        ("instance", "model"),
        "ratio",
        "spec arm vs control arm latency per token - 1",
        spec_latency_regression,
        spec_latency_regression_aggregated,
    ),
    "spec_cost_excess": Signal(
        ("instance", "model"),
        "ratio",
        "speculative vs plain device seconds per output token - 1",
        spec_cost_excess,
        spec_cost_excess_aggregated,
    ),
    "oom_count": Signal(("instance",), "count", "out-of-memory failures", oom_count, oom_count_aggregated),
    "fragmentation": Signal(DEVICE_LABELS, "ratio", "reserved / allocated memory", fragmentation),
    "draft_util_swing": Signal(DEVICE_LABELS, "percentage points", "max - min draft utilisation", draft_util_swing),
    "vllm_acceptance_rate": Signal(
        VLLM_LABELS, "ratio", "vLLM accepted / drafted tokens", _vllm(lambda s: s.acceptance_rate)
    ),
    "vllm_ttft_p99": Signal(VLLM_LABELS, "seconds", "vLLM P99 time to first token", _vllm(lambda s: s.ttft.p99)),
}


class StoreSignals:
    """The signal source over the collector's database. Request signals read the window aggregates
    (`Signal.aggregated`); `raw=True` reads raw rows instead (for comparison: bench/alerts.py).

    Each query reads the store afresh. `cycle(now)` gives a source for one alert cycle: its queries
    at `now` share one `WindowReader`, so the aggregate rows and raw partial seconds that several
    signals, windows and group-bys need are read once per cycle (what a cycle sees is the store
    as of those first reads).
    """

    def __init__(self, engine: Engine, raw: bool = False, reader: WindowReader | None = None) -> None:
        self.engine = engine
        self.raw = raw
        self.reader = reader

    def cycle(self, now: float) -> StoreSignals:
        return StoreSignals(self.engine, self.raw, WindowReader(self.engine, now))

    def query(self, signal: str, window_s: float, group_by: Sequence[str], now: float) -> list[Sample]:
        spec, window = SIGNALS[signal], Window(now - window_s, now)
        if self.raw or spec.aggregated is None:
            return spec.compute(self.engine, window, group_by)
        shared = self.reader is not None and self.reader.end == now
        return spec.aggregated(self.reader if shared else WindowReader(self.engine, now), window, group_by)
