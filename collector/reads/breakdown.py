"""Group-wise views of a window, for the dashboard: speculative vs plain (with a significance
test), acceptance and latency per drafter / instance / scenario tag, throughput by load,
device readings over time, and where the telemetry comes from.

Like `collector.reads.queries`, these read the window's raw rows into numpy and return plain
dataclasses.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass

import numpy as np
from scipy.stats import mannwhitneyu  # imported at start: not on a dashboard's first render
from sqlalchemy import Engine, and_, func, select

from specwatch.collector.models import DeviceSampleRow, EngineEventRow, Request, VllmScrape
from specwatch.collector.reads import reader
from specwatch.collector.reads.queries import (
    LATENCY_AND_DRAFT_COLUMNS,
    Filters,
    Percentiles,
    Subset,
    Window,
    active_span,
    percentiles,
    sample_rows,
)
from specwatch.collector.reads.series import DeviceSnapshot
from specwatch.collector.tiers import sketch
from specwatch.collector.tiers.aggregates import LABELS
from specwatch.collector.tiers.totals import Totals, ratio

GROUP_COLUMNS = ("mode", "arm", "drafter", "instance", "model", "mode_reason")
CDF_POINTS = (0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99)
LOAD_EDGES = (0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0)


@dataclass(frozen=True)
class Group:
    """One group's figures; `s_per_token` = e2e latency / output tokens of ok requests."""

    key: str
    requests: int
    errors: int
    output_tokens: int
    drafted: int
    accepted: int
    acceptance_rate: float | None
    mean_acceptance_length: float | None
    ttft: Percentiles
    e2e: Percentiles
    s_per_token: Percentiles
    s_per_token_mean: float | None
    energy_j_per_token: float | None
    energy_sources: list[str]
    ttft_cdf: list[float | None]
    s_per_token_cdf: list[float | None]
    active_s: float = 0.0  # seconds of the window from the group's first second with a request to its last's end
    request_rate_per_s: float = 0.0  # per active second
    output_tokens_per_s: float = 0.0  # per active second


@dataclass(frozen=True)
class Breakdown:
    """`sampled`: the per-request figures (and, grouped by other than a label, every figure) come
    from that sample of the window's requests."""

    by: str
    groups: list[Group]
    cdf_points: tuple[float, ...] = CDF_POINTS
    sampled: Subset | None = None


@dataclass(frozen=True)
class Comparison:
    """Speculative (`spec` arm or mode) against plain (`control` arm or mode), per output token.

    speedup = plain mean s/token / speculative mean s/token (> 1: speculation pays);
    p_value: two-sided Mann-Whitney U on the per-request s/token (of the sample, when sampled)."""

    by: str
    speculative: Group | None
    plain: Group | None
    speedup: float | None
    p_value: float | None
    sampled: Subset | None = None


_COLUMNS = (*LATENCY_AND_DRAFT_COLUMNS, Request.energy_j, Request.started_at)


def _key_column(by: str):
    if by in GROUP_COLUMNS:
        return getattr(Request, by)
    if by.startswith("tag:") and len(by) > 4:
        return Request.tags[by[4:]].as_string()
    raise ValueError(f"cannot group by {by!r}: use one of {', '.join(GROUP_COLUMNS)} or tag:<key>")


def breakdown(db: Engine, window: Window, filters: Filters = Filters(), by: str = "drafter") -> Breakdown:
    """Per group of `by`: counts, acceptance and TTFT/e2e from the tiered reader when `by` is a label
    the aggregates carry (else from the same sample as the per-request figures, and `sampled` says so)."""
    grouped = _Grouped.read(db, window, filters, by)
    groups = [grouped.group(key) for key in grouped.names()]
    return Breakdown(by, sorted(groups, key=lambda g: -g.requests), sampled=grouped.sample)


@dataclass(frozen=True)
class _Grouped:
    """A window's requests grouped by `by`: per-request rows (all, or a sample) and, for a label the
    aggregates carry, each group's totals from the tiered reader."""

    window: Window
    rows: dict[str, list]  # (status, energy_source, *_COLUMNS) per request
    totals: dict[str, Totals] | None
    sample: Subset | None

    @classmethod
    def read(cls, db: Engine, window: Window, filters: Filters, by: str) -> _Grouped:
        stmt = select(_key_column(by), Request.status, Request.energy_source, *_COLUMNS)
        if filters.tags or by not in LABELS:
            rows, sample = sample_rows(db, stmt, window, filters, reader.population(db, window, filters))
            return cls(window, _by_key(rows), None, sample)
        totals = {_name(k[0]): t for k, t in reader.totals(db, window, filters, (by,), ("ttft", "e2e")).items()}
        population = reader.population_of(window, totals.values())
        rows, sample = sample_rows(db, stmt, window, filters, population)
        return cls(window, _by_key(rows), totals, sample)

    def names(self) -> list[str]:
        return list(self.rows) if self.totals is None else list(self.totals)

    def group(self, key: str) -> Group:
        rows = self.rows.get(key, [])
        headline = _headline(self.totals[key], self.window) if self.totals else _exact_headline(rows, self.window)
        return Group(key=key, **headline, **_per_request(rows))


def _name(value) -> str:
    return "none" if value is None else str(value)


def _by_key(rows: list) -> dict[str, list]:
    grouped: dict[str, list] = defaultdict(list)
    for row in rows:
        grouped[_name(row[0])].append(row[1:])
    return grouped


def _exact_headline(rows: list, window: Window) -> dict:
    """Counts, acceptance, rates and exact TTFT/e2e of the group's raw rows."""
    status = [r[0] for r in rows]
    ttft, e2e, out, drafts, drafted, accepted, _, started = (np.array(c, dtype=float) for c in list(zip(*rows))[2:])
    active = active_span(window, started.min(), (started + e2e).max())  # first start to last finish
    return {
        "requests": len(rows),
        "errors": sum(s == "error" for s in status),
        "output_tokens": int(out.sum()),
        "drafted": int(drafted.sum()),
        "accepted": int(accepted.sum()),
        "acceptance_rate": float(accepted.sum() / drafted.sum()) if drafted.sum() else None,
        "mean_acceptance_length": float(1 + accepted.sum() / drafts.sum()) if drafts.sum() else None,
        "ttft": percentiles(ttft),
        "e2e": percentiles(e2e),
        "ttft_cdf": _cdf(ttft),
        "active_s": active,
        "request_rate_per_s": len(rows) / active if active else 0.0,
        "output_tokens_per_s": float(out.sum()) / active if active else 0.0,
    }


def _headline(totals: Totals, window: Window) -> dict:
    """The same from the group's totals (TTFT/e2e and the TTFT CDF from the merged sketches)."""
    s, ttft = totals.sums, totals.sketches["ttft"]
    return {
        "requests": totals.requests,
        "errors": int(s["errors"]),
        "output_tokens": int(s["output_tokens"]),
        "drafted": int(s["draft_tokens"]),
        "accepted": int(s["accepted_tokens"]),
        "acceptance_rate": ratio(s["accepted_tokens"], s["draft_tokens"]),
        "mean_acceptance_length": None if not s["drafts"] else 1.0 + s["accepted_tokens"] / s["drafts"],
        "ttft": totals.percentiles("ttft"),
        "e2e": totals.percentiles("e2e"),
        "ttft_cdf": [sketch.quantile(ttft, q) for q in CDF_POINTS],
        "active_s": totals.active_s(window),
        "request_rate_per_s": totals.rate("requests", window),
        "output_tokens_per_s": totals.rate("output_tokens", window),
    }


def _per_request(rows: list) -> dict:
    """s/token percentiles, mean and CDF, energy per token and its sources, from per-request rows."""
    if not rows:
        return {"s_per_token": Percentiles(), "s_per_token_mean": None, "energy_j_per_token": None,
                "energy_sources": [], "s_per_token_cdf": [None] * len(CDF_POINTS)}  # fmt: skip
    per_token = _per_token(rows)
    out, energy = (np.array(c, dtype=float) for c in list(zip(*rows))[4:9:4])
    has_energy = ~np.isnan(energy) & (out > 0)
    return {
        "s_per_token": percentiles(per_token),
        "s_per_token_mean": float(per_token.mean()) if per_token.size else None,
        "energy_j_per_token": float(energy[has_energy].sum() / out[has_energy].sum()) if has_energy.any() else None,
        "energy_sources": sorted({r[1] for r in rows if r[1]}),
        "s_per_token_cdf": _cdf(per_token),
    }


def _cdf(values: np.ndarray) -> list[float | None]:
    values = values[~np.isnan(values)]
    return [float(v) for v in np.quantile(values, CDF_POINTS)] if values.size else [None] * len(CDF_POINTS)


def compare(db: Engine, window: Window, filters: Filters = Filters(), by: str = "arm") -> Comparison:
    """`by="arm"` compares the A/B arms (the unbiased comparison); `by="mode"` all speculative vs
    plain requests (biased when the policy picks the mode by load or prompt length)."""
    if by not in ("arm", "mode"):
        raise ValueError("compare by arm or mode")
    names = ("spec", "control") if by == "arm" else ("speculative", "autoregressive")
    grouped = _Grouped.read(db, window, filters, by)
    spec, plain = (grouped.group(name) if name in grouped.names() else None for name in names)
    speedup = p_value = None
    if spec and plain and spec.s_per_token_mean and plain.s_per_token_mean:
        speedup = plain.s_per_token_mean / spec.s_per_token_mean
        samples = [_per_token(grouped.rows.get(name, [])) for name in names]
        if min(len(s) for s in samples) > 1:
            p_value = float(mannwhitneyu(*samples, alternative="two-sided").pvalue)
    return Comparison(by, spec, plain, speedup, p_value, grouped.sample)


def _per_token(rows: list) -> np.ndarray:
    """e2e seconds per output token of the ok requests among `rows` (as `_Grouped` holds them)."""
    return np.array([r[3] / r[4] for r in rows if r[0] == "ok" and r[4] > 0], dtype=float)


@dataclass(frozen=True)
class LoadBucket:
    mode: str
    low: float
    high: float | None
    requests: int
    tokens_per_s: float | None  # mean per-request output tokens / (e2e - queue)
    ttft_p99: float | None
    sampled: Subset | None = None  # the figures rest on that sample of the window's requests


def throughput_by_load(db: Engine, window: Window, filters: Filters = Filters()) -> list[LoadBucket]:
    """Per-request decode speed by the load the request was admitted at, per mode: the knee."""
    columns = (Request.mode, Request.load_at_admission, Request.output_tokens, Request.e2e_s, Request.queue_s)
    stmt = select(*columns, Request.ttft_s).where(Request.load_at_admission.is_not(None))
    rows, sample = sample_rows(db, stmt, window, filters, reader.population(db, window, filters))
    buckets = []
    for mode in sorted({r[0] for r in rows}):
        load, out, e2e, queue, ttft = (
            np.array(c, dtype=float) for c in list(zip(*[r[1:] for r in rows if r[0] == mode]))
        )
        bounds = [*LOAD_EDGES, None]
        for low, high in zip(bounds[:-1], bounds[1:]):
            inside = (load >= low) & (load < (np.inf if high is None else high))
            busy = np.maximum(e2e[inside] - queue[inside], 1e-9)
            if inside.any():
                buckets.append(
                    LoadBucket(
                        mode,
                        low,
                        high,
                        int(inside.sum()),
                        float(np.mean(out[inside] / busy)),
                        percentiles(ttft[inside]).p99,
                        sample,
                    )
                )
    return buckets


def device_series(
    db: Engine, window: Window, instance: str | None = None, max_points: int = 2000
) -> list[DeviceSnapshot]:
    """Device samples in the window, oldest first, thinned evenly to at most `max_points`."""
    stmt = select(*(getattr(DeviceSampleRow, f) for f in DeviceSnapshot.__dataclass_fields__)).where(
        DeviceSampleRow.at >= window.start, DeviceSampleRow.at < window.end
    )
    if instance is not None:
        stmt = stmt.where(DeviceSampleRow.instance == instance)
    with db.connect() as conn:
        rows = conn.execute(stmt.order_by(DeviceSampleRow.at)).all()
    keep = rows if len(rows) <= max_points else [rows[int(i)] for i in np.linspace(0, len(rows) - 1, max_points)]
    return [DeviceSnapshot(*row) for row in keep]


@dataclass(frozen=True)
class Source:
    """One telemetry source: kind engine | vllm | gateway | upstream.

    The fields after `per_s` describe gateways and their upstreams (None for engines and vLLM
    servers): an upstream's `gateway`, `url`, `pool` and `drafter`, and its health (`healthy`,
    `reason` when down) in its gateway's latest snapshot, taken at `reported_at`."""

    kind: str
    name: str
    last_seen_at: float | None
    records_in_window: int
    per_s: float
    gateway: str | None = None
    url: str | None = None
    pool: str | None = None
    drafter: str | None = None
    healthy: bool | None = None
    reason: str | None = None
    reported_at: float | None = None


def sources(db: Engine, window: Window) -> list[Source]:
    """Engines (instances that sent requests or samples), gateways with their upstreams, and scraped
    vLLM servers, with their activity. An instance that is a gateway or one of its upstreams is listed
    as such, not as an engine."""
    samples = select(DeviceSampleRow.instance, func.max(DeviceSampleRow.at)).group_by(DeviceSampleRow.instance)
    scrapes = (
        select(VllmScrape.source, func.max(VllmScrape.at), func.count())
        .where(VllmScrape.at >= window.start, VllmScrape.at < window.end)
        .group_by(VllmScrape.source)
    )
    with db.connect() as conn:
        last_sample = dict(conn.execute(samples).all())
        vllm = conn.execute(scrapes).all()
        snapshots = conn.execute(_latest_upstream_snapshots(window.end)).all()
    by_instance = {  # from the tiered reader: the start of the last second holding a request
        name: (min(t.last_s, window.end), t.requests, t.first_s, t.last_s)
        for (name,), t in reader.totals(db, window, Filters(), ("instance",), ()).items()
    }
    activity = _Activity(by_instance, last_sample, window)
    gateways = [row for snapshot in snapshots for row in _gateway_sources(*snapshot, activity)]
    behind = {row.name for row in gateways}
    engines = [
        Source("engine", name, activity.last_seen(name), activity.count(name), activity.rate(name))
        for name in sorted((by_instance.keys() | last_sample.keys()) - behind)
    ]
    return engines + gateways + [Source("vllm", url, last, n, n / window.seconds) for url, last, n in vllm]


@dataclass(frozen=True)
class _Activity:
    """Per instance: (latest activity, requests, first start and last finish) in the window,
    and its latest device sample ever. Rates are per second of the active span of the instances
    counted, as the signals' `request_rate_per_s` is, so a lone engine shows the Overview's req/s."""

    requests: dict[str, tuple[float, int, float, float]]
    last_sample: dict[str, float]
    window: Window

    def count(self, name: str) -> int:
        return self._of(name)[1]

    def rate(self, *names: str) -> float:
        """Requests of these instances per second of their joint active span."""
        found = [self._of(name) for name in names if self._of(name)[1]]
        if not found:
            return 0.0
        span = active_span(self.window, min(f[2] for f in found), max(f[3] for f in found))
        return sum(f[1] for f in found) / span if span > 0 else 0.0

    def _of(self, name: str) -> tuple[float | None, int, float, float]:
        return self.requests.get(name, (None, 0, 0.0, 0.0))

    def last_seen(self, name: str, *also: float | None) -> float | None:
        seen = [
            t for t in (self.requests.get(name, (None, 0, 0.0))[0], self.last_sample.get(name), *also) if t is not None
        ]
        return max(seen, default=None)


def _latest_upstream_snapshots(before: float):
    """(gateway, at, detail) of each gateway's latest 'upstream' event before `before`, however old:
    health is state, so an upstream down since before the window is still down."""
    latest = (
        select(EngineEventRow.instance, func.max(EngineEventRow.at).label("at"))
        .where(EngineEventRow.kind == "upstream", EngineEventRow.at < before)
        .group_by(EngineEventRow.instance)
        .subquery()
    )
    return (
        select(EngineEventRow.instance, EngineEventRow.at, EngineEventRow.detail)
        .join(latest, and_(EngineEventRow.instance == latest.c.instance, EngineEventRow.at == latest.c.at))
        .where(EngineEventRow.kind == "upstream")
        .order_by(EngineEventRow.instance)
    )


def _gateway_sources(gateway: str, at: float, detail: dict, activity: _Activity) -> list[Source]:
    """The gateway's row, then one per upstream of its snapshot (entries without a name are skipped).

    An upstream's requests are the records whose instance is its name; the gateway's are those of
    its own name (requests no upstream took) plus its upstreams'. Two gateways naming the same
    upstream both count its records: a record does not say which gateway sent it."""
    upstreams = [_upstream_source(gateway, at, entry, activity) for entry in _named_entries(detail)]
    members = [u for u in upstreams if u.name != gateway]
    total = activity.count(gateway) + sum(u.records_in_window for u in members)
    per_s = activity.rate(gateway, *(u.name for u in members))
    row = Source("gateway", gateway, activity.last_seen(gateway, at), total, per_s, reported_at=at)
    return [row, *upstreams]


def _named_entries(detail: object) -> list[dict]:
    """The snapshot's upstream entries that have a name, the last one of each name (a producer's
    event is validated only as a small dict: anything else in it is ignored, not an error)."""
    entries = detail.get("upstreams") if isinstance(detail, dict) else None
    if not isinstance(entries, list):
        return []
    named = [e for e in entries if isinstance(e, dict) and isinstance(e.get("name"), str) and e["name"]]
    return list({e["name"]: e for e in named}.values())


def _upstream_source(gateway: str, at: float, entry: dict, activity: _Activity) -> Source:
    name = entry["name"]
    healthy = entry.get("healthy")
    return Source(
        "upstream",
        name,
        activity.last_seen(name),
        activity.count(name),
        activity.rate(name),
        gateway=gateway,
        url=_text(entry.get("url")),
        pool=_text(entry.get("pool")),
        drafter=_text(entry.get("drafter")),
        healthy=healthy if isinstance(healthy, bool) else None,
        reason=_text(entry.get("reason")),
        reported_at=at,
    )


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


label_values = reader.label_values  # moved to the tiered reader
