"""The monthly cost-benefit report: `build_report(db, "YYYY-MM", prices)` -> `Report`.

Measured figures are read from the store for the month's UTC window (the current month: up
to now); the cost model's other inputs (prices, the seed's hidden-cost defaults, values given in a
`--hidden-costs` file) are listed with their sources in `cost.tco.assumptions`, and a net benefit
that rests on estimates or seed defaults carries them in `net_benefit_estimated_from` (shown as
"~"). Counts, acceptance and latency percentiles come from the rollups plus raw rows not rolled
up yet (`auto_signals`, `auto_series`), so they cover the whole month; the sections that need
single requests (acceptance vs prompt length, the speculative-vs-plain test, the load knee, the
TCO and its cost against concurrency) read the raw rows still held, and say how many that is
when retention has already dropped some.

The recommendation is a pure function of the month's headline (`recommend`), thresholds
from `cost.advisor.AdvisorRules`:

    measured speed-up (plain s/token / speculative s/token, Mann-Whitney p):
        pays  = speed-up >= 1.05 and p < 0.05;  hurts = speed-up <= 0.95 and p < 0.05;  else unclear
    no speculative requests                        keep     (nothing to judge)
    hurts                                          disable
    measured saving < 0            and pays        shrink   (faster, but costs more per token)
    measured saving < 0            otherwise       disable
    saving not computable (no plain arm)           keep
    saving >= 0, pays,    no alert fired           expand
    saving >= 0, pays,    alerts fired             keep
    saving >= 0, unclear, alerts fired             shrink
    saving >= 0, unclear, no alert fired           keep

The saving is the cost verdict's (`cost.verdict`): what speculation measurably saves per token at the
month's volume. Assumed fixed costs (draft training, incidents, the reserve) never flip it: the report
states the verdict's break-even volume for them, as every other view does.

"What changed" compares the headline with the previous month's, computed from the store the
same way (raw-row figures of a month past retention come out as n/a).
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, replace
from datetime import UTC, datetime

from sqlalchemy import Engine

from specwatch.alerts.store import history, incident_history
from specwatch.collector.reads.breakdown import Comparison, LoadBucket, compare, throughput_by_load
from specwatch.collector.reads.history import auto_series, errors_by_hour_long
from specwatch.collector.reads.long_signals import auto_signals
from specwatch.collector.reads.queries import (
    Filters,
    HourOfDay,
    LengthCorrelation,
    Signals,
    Window,
    acceptance_vs_length,
)
from specwatch.collector.reads.reads import raw_request_count, request_label_values
from specwatch.cost.advisor import AdvisorRules
from specwatch.cost.inputs import Overrides
from specwatch.cost.model import HiddenCosts, Prices
from specwatch.cost.summary import CostSummary, measured_summary
from specwatch.report.delivery import REPORT_STATUS

_MONTH = re.compile(r"(\d{4})-(0[1-9]|1[0-2])")
KNEE_DROP = 0.8  # the knee: per-request decode speed below 80% of the lightest load's
RECENT = 20  # alert transitions and actions listed


def month_window(month: str, now: float | None = None) -> Window:
    """The month's [start, end) in UTC epoch seconds, cut at `now` for the current month.
    ValueError for anything but YYYY-MM of a month that has begun."""
    start, end = month_bounds(month)
    now = time.time() if now is None else now
    if start >= now:
        raise ValueError(f"{month} has not begun yet")
    return Window(start, min(end, now))


def month_bounds(month: str) -> tuple[float, float]:
    """The whole month's [start, end) in UTC epoch seconds; ValueError unless YYYY-MM."""
    found = _MONTH.fullmatch(month or "")
    if not found:
        raise ValueError(f"month must be YYYY-MM, got {month!r}")
    year, mon = int(found[1]), int(found[2])
    start = datetime(year, mon, 1, tzinfo=UTC).timestamp()
    return start, datetime(year + mon // 12, mon % 12 + 1, 1, tzinfo=UTC).timestamp()


def previous_month(month: str) -> str:
    year, mon = int(month[:4]), int(month[5:7])
    return f"{year - 1}-12" if mon == 1 else f"{year}-{mon - 1:02d}"


def this_month(now: float | None = None) -> str:
    """The current UTC month, YYYY-MM."""
    return datetime.fromtimestamp(time.time() if now is None else now, UTC).strftime("%Y-%m")


def last_month(now: float | None = None) -> str:
    """The month before the current UTC one."""
    today = datetime.fromtimestamp(time.time() if now is None else now, UTC)
    return previous_month(f"{today.year}-{today.month:02d}")


# --- the report's parts ----------------------------------------------------------------------


@dataclass(frozen=True)
class Share:
    key: str
    requests: int
    share: float


@dataclass(frozen=True)
class Traffic:
    requests: int
    errors: int
    ooms: int
    output_tokens: int
    raw_requests: int  # requests still held as raw rows (the raw-row sections cover these)
    by_mode: tuple[Share, ...]
    by_drafter: tuple[Share, ...]
    by_arm: tuple[Share, ...]


@dataclass(frozen=True)
class Day:
    day: str  # YYYY-MM-DD (UTC)
    requests: int
    acceptance_rate: float | None
    mean_acceptance_length: float | None


@dataclass(frozen=True)
class LoadKnee:
    buckets: tuple[LoadBucket, ...]
    knee: dict[str, float | None]  # mode -> lower load bound of its knee bucket
    crossover: float | None  # lowest load where speculation decodes no faster than plain


@dataclass(frozen=True)
class AlertSummary:
    fired: dict[str, int]  # rule -> times it started firing
    resolved: int
    actions: dict[str, int]  # "action: outcome" -> count
    notifications: dict[str, int]  # delivery status -> count
    recent_transitions: tuple[dict, ...]
    recent_actions: tuple[dict, ...]


@dataclass(frozen=True)
class Headline:
    requests: int
    errors: int
    ooms: int
    output_tokens: int
    speculative_share: float | None
    acceptance_rate: float | None
    mean_acceptance_length: float | None
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    e2e_p99_s: float | None
    speedup: float | None
    speedup_p_value: float | None
    net_monthly_benefit_usd: float | None
    alerts_fired: int
    net_benefit_estimated_from: tuple[str, ...] = ()  # estimates and seed defaults behind the net benefit
    measured_saving_usd: float | None = None  # the cost verdict's saving per month (None: no plain arm)


@dataclass(frozen=True)
class Action:
    """The report's recommendation; the cost verdict (`cost.verdict`) is the answer it rests on."""

    action: str  # keep | expand | shrink | disable
    rule: str
    reason: str


@dataclass(frozen=True)
class Change:
    name: str
    current: float | None
    previous: float | None
    delta: float | None


@dataclass(frozen=True)
class Report:
    month: str
    window: Window
    partial: bool  # the month is not over yet
    generated_at: float
    headline: Headline
    traffic: Traffic
    daily: tuple[Day, ...]
    by_length: LengthCorrelation
    latency: Comparison
    load: LoadKnee
    alerts: AlertSummary
    by_hour: tuple[HourOfDay, ...]
    cost: CostSummary
    recommendation: Action
    previous_month: str
    previous: Headline | None  # None: no traffic stored for the previous month
    changes: tuple[Change, ...]
    notes: tuple[str, ...]


# --- building ----------------------------------------------------------------------------------


def build_report(
    db: Engine,
    month: str,
    prices: Prices,
    gpu_type: str | None = None,
    previous: bool = True,
    now: float | None = None,
    hidden: HiddenCosts | None = None,
    overrides: Overrides = Overrides(),
    incidents_from_alerts: bool = False,
) -> Report:
    """The month's report from the store; `hidden`: hidden-cost overrides (`cost.inputs.load_hidden_costs`),
    `overrides` (pricing, idle allocation, ...) and `incidents_from_alerts` as in `cost.summary.measured_summary`,
    applied to this month and the previous one. ValueError on a bad month or an unknown GPU type."""
    pricing = PricingChoice(hidden or HiddenCosts(), overrides, incidents_from_alerts)
    now = time.time() if now is None else now
    window = month_window(month, now)
    sig = auto_signals(db, window)
    traffic = _traffic(db, window, sig)
    latency = _comparison(db, window)
    cost = pricing.summary(db, window, prices, gpu_type)
    alerts = alert_summary(db, window)
    head = _headline(sig, traffic.by_mode, latency, cost, alerts)
    prior_month = previous_month(month)
    prior = month_headline(db, month_window(prior_month, now), prices, gpu_type, pricing) if previous else None
    prior = prior if prior is not None and prior.requests else None
    return Report(
        month,
        window,
        window.end < month_bounds(month)[1],
        now,
        head,
        traffic,
        _daily(db, window),
        replace(acceptance_vs_length(db, window), points=[]),
        latency,
        load_knee(throughput_by_load(db, window)),
        alerts,
        tuple(errors_by_hour_long(db, window)),
        cost,
        recommend(head),
        prior_month,
        prior,
        changes(head, prior),
        _notes(traffic),
    )


def month_headline(
    db: Engine, window: Window, prices: Prices, gpu_type: str | None = None, pricing: PricingChoice | None = None
) -> Headline:
    """The headline figures of any window, computed as `build_report` does."""
    sig = auto_signals(db, window)
    cost = (pricing or PricingChoice()).summary(db, window, prices, gpu_type)
    return _headline(
        sig,
        _shares(db, window, "mode", sig.requests),
        _comparison(db, window),
        cost,
        alert_summary(db, window),
    )


def _headline(
    sig: Signals, by_mode: tuple[Share, ...], latency: Comparison, cost: CostSummary, alerts: AlertSummary
) -> Headline:
    spec = next((s.share for s in by_mode if s.key == "speculative"), 0.0) if sig.requests else None
    t = cost.tco
    primary = next((b for b in t.benefits if b.key == t.primary), None)
    return Headline(
        sig.requests,
        sig.errors,
        sig.ooms,
        sig.output_tokens,
        spec,
        sig.acceptance_rate,
        sig.mean_acceptance_length,
        sig.ttft.p50,
        sig.ttft.p99,
        sig.e2e.p99,
        latency.speedup,
        latency.p_value,
        None if primary is None else primary.net_usd,
        sum(alerts.fired.values()),
        () if primary is None else primary.estimated_from,
        None if cost.verdict is None else cost.verdict.saving_usd_per_month,
    )


@dataclass(frozen=True)
class PricingChoice:
    """How a report prices its months (the same for the month and the one before it)."""

    hidden: HiddenCosts = HiddenCosts()
    overrides: Overrides = Overrides()
    incidents_from_alerts: bool = False

    def summary(self, db: Engine, window: Window, prices: Prices, gpu_type: str | None) -> CostSummary:
        return measured_summary(
            db,
            window,
            prices,
            gpu_type=gpu_type,
            overrides=self.overrides,
            hidden=self.hidden,
            incidents=incident_history(db, window) if self.incidents_from_alerts else None,
        )


def _traffic(db: Engine, window: Window, sig: Signals) -> Traffic:
    output = sig.output_tokens
    return Traffic(
        sig.requests,
        sig.errors,
        sig.ooms,
        output,
        raw_request_count(db, window),
        _shares(db, window, "mode", sig.requests),
        _shares(db, window, "drafter", sig.requests),
        _shares(db, window, "arm", sig.requests),
    )


def _shares(db: Engine, window: Window, column: str, total: int) -> tuple[Share, ...]:
    """Requests per value of `column` over the whole month (rollups + raw rows), most first.
    Requests without a drafter count as "none"; without an arm they are left out."""
    values = set(request_label_values(db, window, column))
    if column == "drafter":
        values = {"none" if v in (None, "") else v for v in values}
    values -= {None, ""}
    counts = [(v, auto_signals(db, window, Filters(**{column: v})).requests) for v in sorted(values)]
    return tuple(Share(v, n, n / total if total else 0.0) for v, n in sorted(counts, key=lambda c: -c[1]) if n)


def _comparison(db: Engine, window: Window) -> Comparison:
    """By A/B arm when both arms have requests (unbiased), else by mode."""
    by_arm = compare(db, window, by="arm")
    return by_arm if by_arm.speculative and by_arm.plain else compare(db, window, by="mode")


def _daily(db: Engine, window: Window) -> tuple[Day, ...]:
    days = auto_series(db, window, step_s=86400.0)
    return tuple(
        Day(
            datetime.fromtimestamp(p.t, UTC).strftime("%Y-%m-%d"),
            p.requests,
            p.acceptance_rate,
            p.mean_acceptance_length,
        )
        for p in days
    )


def load_knee(buckets: list[LoadBucket]) -> LoadKnee:
    """Per mode, the first load bucket whose per-request decode speed falls below KNEE_DROP of
    the lightest-loaded bucket's (beyond it more load mostly makes requests slower); and the
    lowest load at which speculative requests decode no faster than plain ones."""
    knee: dict[str, float | None] = {}
    for mode in sorted({b.mode for b in buckets}):
        rows = sorted((b for b in buckets if b.mode == mode and b.tokens_per_s is not None), key=lambda b: b.low)
        base = rows[0].tokens_per_s if rows else None
        knee[mode] = next((b.low for b in rows[1:] if b.tokens_per_s < KNEE_DROP * base), None) if base else None
    plain = {b.low: b.tokens_per_s for b in buckets if b.mode == "autoregressive" and b.tokens_per_s is not None}
    spec = sorted((b.low, b.tokens_per_s) for b in buckets if b.mode == "speculative" and b.tokens_per_s is not None)
    crossover = next((low for low, tps in spec if low in plain and tps <= plain[low]), None)
    return LoadKnee(tuple(buckets), knee, crossover)


def alert_summary(db: Engine, window: Window) -> AlertSummary:
    found = history(db, window, limit=100_000)
    fired: dict[str, int] = {}
    for t in found["transitions"]:
        if t["to_state"] == "firing":
            fired[t["rule"]] = fired.get(t["rule"], 0) + 1
    return AlertSummary(
        fired,
        sum(t["from_state"] == "firing" for t in found["transitions"]),
        _count(f"{a['action']}: {a['outcome']}" for a in found["actions"]),
        _count(n["status"] for n in found["notifications"] if n["alert_status"] != REPORT_STATUS),
        tuple(found["transitions"][:RECENT]),
        tuple(found["actions"][:RECENT]),
    )


def _count(keys) -> dict[str, int]:
    counts: dict[str, int] = {}
    for key in keys:
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items(), key=lambda kv: -kv[1]))


def recommend(h: Headline, rules: AdvisorRules = AdvisorRules()) -> Action:
    """keep | expand | shrink | disable by the table of the module docstring."""
    significant = h.speedup is not None and h.speedup_p_value is not None and h.speedup_p_value < rules.significance
    pays = significant and h.speedup >= rules.pays_speedup
    hurts = significant and h.speedup <= rules.hurts_speedup
    speed = "not compared" if h.speedup is None else f"measured speed-up {h.speedup:.2f}x (p={_p(h.speedup_p_value)})"
    saving = h.measured_saving_usd
    money = "not computable" if saving is None else f"measured saving {saving:,.2f} USD/month"
    alerts = f"{h.alerts_fired} alert(s) fired"
    if not h.speculative_share:
        return Action("keep", "not_in_use", "no speculative requests this month: nothing to judge")
    if hurts:
        return Action("disable", "measured_slower", f"{speed}: speculation is significantly slower")
    if saving is None:
        return Action("keep", "not_priced", f"{speed}; {money} (no plain-decoding requests to price against)")
    if saving < 0:
        if pays:
            return Action("shrink", "faster_but_costs_more", f"{speed}, but {money}: keep it only where it pays most")
        return Action("disable", "no_gain_costs_more", f"{speed}; {money}")
    if pays:
        action, rule = ("keep", "pays_with_alerts") if h.alerts_fired else ("expand", "pays_quietly")
    else:
        action, rule = ("shrink", "unproven_with_alerts") if h.alerts_fired else ("keep", "unproven_no_harm")
    return Action(action, rule, f"{speed}; {money}; {alerts}")


def _p(p: float | None) -> str:
    return "n/a" if p is None else f"{p:.2g}"


_COMPARED = (
    "requests",
    "errors",
    "ooms",
    "output_tokens",
    "speculative_share",
    "acceptance_rate",
    "mean_acceptance_length",
    "ttft_p50_s",
    "ttft_p99_s",
    "e2e_p99_s",
    "speedup",
    "net_monthly_benefit_usd",
    "alerts_fired",
)


def changes(current: Headline, prior: Headline | None) -> tuple[Change, ...]:
    if prior is None:
        return ()
    rows = []
    for name in _COMPARED:
        now, before = getattr(current, name), getattr(prior, name)
        rows.append(Change(name, now, before, None if now is None or before is None else now - before))
    return tuple(rows)


def _notes(traffic: Traffic) -> tuple[str, ...]:
    if traffic.requests and traffic.raw_requests < traffic.requests:
        return (
            f"raw-row sections (acceptance vs length, latency test, load knee, cost) cover the "
            f"{traffic.raw_requests:,} of {traffic.requests:,} requests still held as raw rows; "
            "the older ones were rolled up and expired under the raw retention",
        )
    return ()


# --- writing -------------------------------------------------------------------------------------


def report_names(month: str) -> tuple[str, str]:
    return f"specwatch-report-{month}.html", f"specwatch-report-{month}.json"


def to_json(report: Report) -> bytes:
    import orjson

    return orjson.dumps(report, option=orjson.OPT_INDENT_2 | orjson.OPT_SERIALIZE_NUMPY)
