"""The monthly report as one self-contained HTML page: `render_html(report) -> str`.

Plain functions that return HTML fragments, escaped with `html.escape`, filled into
`report/template.html` (string.Template: `$title`, `$body`). Plots are SVG data URIs
(`report.plots`); nothing is fetched when the page opens. Figures whose energy was
not metered (`energy_source` estimate) are marked as estimates; the cost model's inputs are
listed with their sources (seed defaults and estimates marked), and a net benefit that rests on
any of them carries "~" and a footnote naming them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from html import escape
from pathlib import Path
from string import Template

from specwatch.collector.reads.breakdown import Group
from specwatch.cost.concurrency import ConcurrencyCosts
from specwatch.cost.model import SEED, Assumption, Benefit, Tco
from specwatch.cost.summary import CostSummary
from specwatch.report import plots
from specwatch.report.build import Headline, Report, report_names, to_json

TEMPLATE = Path(__file__).with_name("template.html")
ESTIMATE = '<span class="estimate" title="not metered: CPU-seconds x watts per busy core">estimate</span>'
SEED_MARK = '<span class="assumed" title="the seed\'s figure: never measured nor given">default (seed)</span>'
IN_PRICE = '<span class="in-price" title="the GPU-hour price already pays for power: not added">in the price</span>'


def render_html(report: Report) -> str:
    sections = [_title(report), _verdict(report), _changes(report)]
    if report.headline.requests:
        sections += [
            _traffic(report),
            _acceptance(report),
            _latency(report),
            _load(report),
            _alerts(report),
            _hours(report),
            _cost(report.cost),
        ]
    else:
        sections += [
            f'<p class="empty">No traffic in {escape(report.month)}: the store holds no request for this '
            "month, so there is nothing to measure or price.</p>",
            _alerts(report),
        ]
    sections.append(_notes(report))
    title = f"specwatch report {report.month}"
    return Template(TEMPLATE.read_text()).substitute(title=escape(title), body="\n".join(sections))


# --- formatting -----------------------------------------------------------------------------


def _f(value: float | None, fmt: str = ".3f", suffix: str = "") -> str:
    return "n/a" if value is None else f"{value:{fmt}}{suffix}"


def _pct(value: float | None) -> str:
    return _f(None if value is None else 100 * value, ".1f", "%")


def _ms(value: float | None) -> str:
    return _f(None if value is None else 1000 * value, ",.1f", " ms")


def _usd(value: float | None, digits: int = 0) -> str:
    return "n/a" if value is None else ("-" if value < 0 else "") + f"${abs(value):,.{digits}f}"


def _pval(p: float | None) -> str:
    return "n/a" if p is None else "< 1e-300" if p == 0 else f"{p:.2g}"


def _when(epoch: float) -> str:
    return datetime.fromtimestamp(epoch, UTC).strftime("%Y-%m-%d %H:%M UTC")


_NUMBER = re.compile(r"~?[-+]?\$?[\d,.]+( ms| months|%|x)?|n/a|-|[-+]?\$[\d,.]+ <span.*")


def _td(text: str) -> str:
    return f'<td class="n">{text}</td>' if _NUMBER.fullmatch(text) else f"<td>{text}</td>"


def _table(head: Sequence[str], rows: Iterable[Sequence[object]], raw: bool = False) -> str:
    """A table; cells are escaped unless `raw` (for cells built here with markup); numbers align right."""
    cell = (lambda c: str(c)) if raw else (lambda c: escape(str(c)))
    body = "".join("<tr>" + "".join(_td(cell(c)) for c in row) + "</tr>" for row in rows)
    return (
        f"<table><thead><tr>{''.join(f'<th>{escape(h)}</th>' for h in head)}</tr></thead><tbody>{body}</tbody></table>"
    )


def _img(uri: str | None, alt: str) -> str:
    return "" if uri is None else f'<img src="{uri}" alt="{escape(alt)}">'


def _section(anchor: str, title: str, *parts: str) -> str:
    return f'<section id="{anchor}"><h2>{escape(title)}</h2>\n' + "\n".join(p for p in parts if p) + "\n</section>"


# --- sections -------------------------------------------------------------------------------


def _title(r: Report) -> str:
    span = f"{_when(r.window.start)} to {_when(r.window.end)}" + (" (month in progress)" if r.partial else "")
    return (
        f"<h1>specwatch monthly report: {escape(r.month)}</h1>"
        f'<p class="sub">{escape(span)}; generated {escape(_when(r.generated_at))}. Measured figures are read '
        "from the specwatch store; the cost model's other inputs (prices, seed defaults, given values) are "
        'listed with their sources in the <a href="#assumptions">assumptions table</a>, and "~" marks a figure '
        "that rests on estimates or seed defaults.</p>"
    )


def _verdict(r: Report) -> str:
    v, judged = r.recommendation, r.cost.verdict
    sentence = f'<p class="verdict-sentence"><b>{escape(judged.sentence)}</b></p>' if judged else ""
    return _section(
        "recommendation",
        "Recommendation",
        f'{sentence}<div class="verdict {escape(v.action)}"><div class="action">{escape(v.action)} speculation</div>'
        f'<div>{escape(v.reason)}</div><div class="note">rule <code>{escape(v.rule)}</code> '
        "(the decision table is <code>recommend</code> in <code>report/build.py</code>: measured speed-up and "
        "its significance, the measured saving per month, alerts fired)</div></div>",
    )


_LABELS = {
    "requests": ("requests", lambda v: _f(v, ",.0f")),
    "errors": ("errors", lambda v: _f(v, ",.0f")),
    "ooms": ("OOMs", lambda v: _f(v, ",.0f")),
    "output_tokens": ("output tokens", lambda v: _f(v, ",.0f")),
    "speculative_share": ("speculative share", _pct),
    "acceptance_rate": ("acceptance rate", _f),
    "mean_acceptance_length": ("mean acceptance length", _f),
    "ttft_p50_s": ("TTFT p50", _ms),
    "ttft_p99_s": ("TTFT p99", _ms),
    "e2e_p99_s": ("e2e p99", _ms),
    "speedup": ("measured speed-up (x)", _f),
    "speedup_p_value": ("speed-up p-value", _pval),
    "net_monthly_benefit_usd": ("net benefit (USD/month)", _usd),
    "alerts_fired": ("alerts fired", lambda v: _f(v, ",.0f")),
}


def _signed(name: str, delta: float | None) -> str:
    if delta is None:
        return "n/a"
    fmt = _LABELS[name][1]
    text = fmt(abs(delta))
    return text if text == fmt(0.0) else ("+" if delta > 0 else "-") + text


NET = "net_monthly_benefit_usd"


def _headline_cell(name: str, head: Headline) -> str:
    """A headline figure; the net benefit marked "~" when it rests on estimates or seed defaults."""
    text = _LABELS[name][1](getattr(head, name))
    return _mark(text, name == NET and bool(head.net_benefit_estimated_from))


def _mark(text: str, estimated: bool) -> str:
    return "~" + text if estimated and text != "n/a" else text


def _changes(r: Report) -> str:
    if r.previous is None:
        rows = [(_LABELS[n][0], _headline_cell(n, r.headline)) for n in Headline.__dataclass_fields__ if n in _LABELS]
        return _section(
            "changes",
            "Headline figures",
            _table(("figure", r.month), rows),
            _estimate_footnote("The net benefit", r.headline.net_benefit_estimated_from),
            f"<p>What changed since the previous month: no previous month ({escape(r.previous_month)} "
            "holds no traffic in the store).</p>",
        )
    either = bool(r.headline.net_benefit_estimated_from or r.previous.net_benefit_estimated_from)
    rows = [
        (
            _LABELS[c.name][0],
            _headline_cell(c.name, r.headline),
            _headline_cell(c.name, r.previous),
            _mark(_signed(c.name, c.delta), c.name == NET and either),
        )
        for c in r.changes
    ]
    return _section(
        "changes",
        f"Headline figures and what changed since {r.previous_month}",
        _table(("figure", r.month, r.previous_month, "change"), rows),
        _estimate_footnote(f"The net benefit of {r.month}", r.headline.net_benefit_estimated_from),
    )


def _estimate_footnote(what: str, estimated_from: Sequence[str]) -> str:
    """'~' explained: the estimates and seed defaults a figure rests on (empty when none)."""
    if not estimated_from:
        return ""
    return (
        f'<p class="note footnote">~ {escape(what)} is an estimate: it rests on inputs that are estimates or '
        f"seed defaults, not measured or given: {escape(', '.join(estimated_from))}. Their values and sources "
        'are in the <a href="#assumptions">assumptions table</a>.</p>'
    )


def _shares(title: str, shares) -> str:
    return (
        _table((title, "requests", "share"), [(s.key, f"{s.requests:,}", _pct(s.share)) for s in shares])
        if shares
        else ""
    )


def _traffic(r: Report) -> str:
    t = r.traffic
    return _section(
        "traffic",
        "Traffic and mode share",
        f"<p>{t.requests:,} requests ({t.errors:,} errors, {t.ooms:,} OOMs), {t.output_tokens:,} output tokens.</p>",
        _shares("mode", t.by_mode),
        _shares("drafter", t.by_drafter),
        _shares("A/B arm", t.by_arm),
    )


def _acceptance(r: Report) -> str:
    c = r.by_length
    corr = (
        "Spearman's rho between prompt length and per-request acceptance: "
        f"{_f(c.spearman_rho)} (p={_pval(c.p_value)}, {c.requests:,} requests that drafted)."
    )
    buckets = [
        (f"{b.low}-{b.high}" if b.high is not None else f">={b.low}", f"{b.requests:,}", _f(b.acceptance_rate))
        for b in c.buckets
        if b.requests
    ]
    return _section(
        "acceptance",
        "Acceptance",
        f"<p>Acceptance rate over the month {_f(r.headline.acceptance_rate)} (accepted / drafted tokens), "
        f"mean acceptance length {_f(r.headline.mean_acceptance_length)}.</p>",
        "<h3>Daily trend</h3>",
        _img(plots.daily_plot(r.daily), "requests and acceptance rate per day"),
        "<h3>Acceptance against prompt length</h3>",
        f"<p>{escape(corr)}</p>",
        _img(plots.length_plot(c.buckets), "acceptance rate per prompt-length bucket"),
        _table(("prompt tokens", "requests", "acceptance rate"), buckets) if buckets else "",
    )


def _group_rows(g: Group | None, name: str) -> list[tuple]:
    if g is None:
        return []
    return [
        (
            name,
            f"{g.requests:,}",
            _ms(g.ttft.p50),
            _ms(g.ttft.p90),
            _ms(g.ttft.p99),
            _ms(g.e2e.p50),
            _ms(g.e2e.p99),
            _ms(g.s_per_token.p50),
            _ms(g.s_per_token.p99),
        )
    ]


def _latency(r: Report) -> str:
    c = r.latency
    if c.speculative is None and c.plain is None:
        return _section("latency", "Latency: speculative against plain", "<p>No request to compare.</p>")
    how = (
        "the A/B arms (spec against control: requests split at random, an unbiased comparison)"
        if c.by == "arm"
        else "mode (all speculative against all plain requests: biased when the policy chose the mode by load or "
        "prompt length)"
    )
    test = (
        f"Measured speed-up {_f(c.speedup, '.2f')}x (plain mean s/token / speculative mean s/token); two-sided "
        f"Mann-Whitney U on per-request s/token: p={_pval(c.p_value)}."
    )
    names = ("spec arm", "control arm") if c.by == "arm" else ("speculative", "plain")
    rows = _group_rows(c.speculative, names[0]) + _group_rows(c.plain, names[1])
    return _section(
        "latency",
        "Latency: speculative against plain",
        f"<p>Compared by {escape(how)}.</p>",
        _table(
            ("", "requests", "TTFT p50", "TTFT p90", "TTFT p99", "e2e p50", "e2e p99", "s/token p50", "s/token p99"),
            rows,
        ),
        f"<p>{escape(test)}</p>",
        _img(plots.latency_plot(c), "latency percentiles, speculative against plain"),
    )


def _load(r: Report) -> str:
    k = r.load
    if not k.buckets:
        return _section(
            "load", "Throughput against load", "<p>No request recorded its load at admission: no knee to show.</p>"
        )
    knees = "; ".join(
        f"{m}: {'none within the measured loads' if v is None else f'from load {v:g}'}" for m, v in k.knee.items()
    )
    cross = (  # the cost crossover has one definition (cost.concurrency.crossover): see the cost section
        "per-request speed only; where speculation starts to cost more is the crossover in the cost section"
    )
    rows = [
        (
            b.mode,
            f"{b.low:g}-{'' if b.high is None else f'{b.high:g}'}",
            f"{b.requests:,}",
            _f(b.tokens_per_s, ".1f"),
            _ms(b.ttft_p99),
        )
        for b in k.buckets
    ]
    return _section(
        "load",
        "Throughput against load",
        f"<p>Knee (per-request decode speed below 80% of the lightest load's): {escape(knees)}. "
        f"{escape(cross.capitalize())}.</p>",
        _img(plots.load_plot(k.buckets, k.knee), "decode speed by load"),
        _table(("mode", "load", "requests", "tokens/s per request", "TTFT p99"), rows),
    )


def _alerts(r: Report) -> str:
    a = r.alerts
    fired = _table(("rule", "times fired"), a.fired.items()) if a.fired else "<p>No alert fired this month.</p>"
    actions = (
        _table(("remediation: outcome", "count"), a.actions.items()) if a.actions else "<p>No remediation action.</p>"
    )
    sent = ", ".join(f"{n} {s}" for s, n in a.notifications.items()) or "none"
    recent = (
        _table(
            ("at", "rule", "labels", "from", "to", "value"),
            [
                (
                    _when(t["at"]),
                    t["rule"],
                    ", ".join(f"{k}={v}" for k, v in t["labels"].items()),
                    t["from_state"],
                    t["to_state"],
                    _f(t["value"], ".3g"),
                )
                for t in a.recent_transitions
            ],
        )
        if a.recent_transitions
        else ""
    )
    return _section(
        "alerts",
        "Alerts fired and actions taken",
        fired,
        f"<p>{a.resolved} resolved; webhook notifications: {escape(sent)}.</p>",
        actions,
        "<h3>Latest transitions</h3>" + recent if recent else "",
    )


def _hours(r: Report) -> str:
    most = max(h.ooms for h in r.by_hour)
    peaks = ", ".join(f"{h.hour:02d}:00" for h in r.by_hour if most and h.ooms == most)
    text = (
        "No OOM this month."
        if not most
        else f"{r.headline.ooms} OOMs; most in the hour(s) starting {peaks} UTC ({most} each)."
    )
    errors = sum(h.errors for h in r.by_hour)
    return _section(
        "oom",
        "Errors and OOMs by hour of day",
        f"<p>{escape(text)} {errors:,} errors in all.</p>",
        _img(plots.hours_plot(r.by_hour), "requests, errors and OOMs by hour of day"),
    )


def _energy_cell(a) -> str:
    """An arm's energy per 1M tokens: its source, "estimate" marked, "in the price" when not added."""
    if a.energy_source is None:
        return "not measured ($0)" if a.energy_added else "not measured"
    if "estimate" in a.energy_source:
        text = escape(_usd(a.energy_usd_per_mtok, 4)) + " " + ESTIMATE
    else:
        text = escape(f"{_usd(a.energy_usd_per_mtok, 4)} ({a.energy_source})")
    return text if a.energy_added else f"{text} {IN_PRICE}"


def _cost(s: CostSummary) -> str:
    t = s.tco
    title = "Cost (TCO), break-even and sensitivity"
    if not t.arms:
        return _section(
            "cost", title, "<p>No request held as a raw row to price this month.</p>", _pricing(t), _assumptions(t)
        )
    parts = [_pricing(t), _bill(t), _arm_table(t), _idle(t)]
    if any(a.energy_source and "estimate" in a.energy_source for a in t.arms):
        parts.append(
            f"<p>{ESTIMATE} Energy marked estimate was not metered (no NVML or RAPL reading): it is "
            "modelled, and so are the totals that include it.</p>"
        )
    parts += [_benefits(s), _assumptions(t), _concurrency(s.concurrency), *_break_even(s), _tornado(s), _advice(s)]
    return _section("cost", title, *parts)


def _bill(t: Tco) -> str:
    """The window's bill and the lines that make it up (cost.allocation: Σ lines = the bill)."""
    a = t.allocation
    if a is None or not a.bills:
        return ""
    rows = [(line.instance, line.kind.replace("_", " "), line.arm or "", _usd(line.usd, 4)) for line in a.lines]
    rows.append(("Σ lines", "", "", _usd(a.lines_usd, 4)))
    rows.append(("bill", f"{sum(b.gpu_hours for b in a.bills):,.3f} instance-hours", "", _usd(a.bill_usd, 4)))
    return (
        '<div id="bill"><h3>The bill and its lines</h3><p>Every instance\'s bill split with nothing left over: each '
        f"arm's device time, failed work (retries), idle time ({escape(a.method)}) and the part of the device other "
        "tenants hold.</p>"
        + _img(plots.bill_plot(a.by_kind()), "the bill as stacked lines")
        + _table(("instance", "line", "arm", "USD"), rows)
        + "</div>"
    )


def _pricing(t: Tco) -> str:
    power = (
        "on-prem: the GPU-hour is depreciation, so energy (measured or estimated) is added"
        if t.pricing == "on-prem"
        else f"{t.pricing}: the GPU-hour price includes power, so energy is shown for information, not added"
    )
    return (
        f"<p>{escape(t.gpu_type)} at ${t.gpu_hour_usd:.2f}/GPU-hour, {escape(t.pricing)} pricing (prices as of "
        f"{escape(t.prices_as_of or 'n/a')}; {escape(power)}); {t.monthly_output_tokens:,.0f} output tokens/month "
        f"({escape(t.volume_source)}). GPU-hours are the device time attributed to each arm's requests (their "
        "share of each batched forward), so an instance serving several requests at once is priced by what it "
        "serves.</p>"
    )


def _arm_table(t: Tco) -> str:
    spread = t.idle is not None and t.idle.allocation == "by_share"
    head = [
        "USD per 1M output tokens",
        "memory share",
        "GPU-hours (device time)",
        "device time from",
        "compute",
        "energy",
        "retries",
        *(["idle (spread by share)"] if spread else []),
        "total",
        "monthly USD at the volume",
    ]
    rows = [
        (
            escape(a.key),
            _f(a.memory_share),
            _f(a.gpu_hours_per_mtok, ".4g"),
            escape(a.device_s_source),
            escape(_usd(a.compute_usd_per_mtok, 4)),
            _energy_cell(a),
            escape(_usd(a.retries_usd_per_mtok, 4)),
            *([escape(_usd(a.idle_usd_per_mtok, 4))] if spread else []),
            escape(_usd(a.total_usd_per_mtok, 4)),
            escape(_usd(a.monthly_usd)),
        )
        for a in t.arms
    ]
    return _table(head, rows, raw=True)


def _idle(t: Tco) -> str:
    i = t.idle
    if i is None:
        return (
            '<p class="idle">Idle device time: not measured (no device samples in the month): only the device '
            "time requests used is priced.</p>"
        )
    where = (
        "spread over the arms by their device time (the idle column above)"
        if i.allocation == "by_share"
        else "its own line, not in the arms above"
    )
    return (
        f'<p class="idle">Idle device time: {_pct(i.idle_fraction)} of the {i.up_s:,.0f} s the instances were up '
        f"(sampled) served no request; {escape(_usd(i.monthly_usd))}/month at this rate, {escape(where)}.</p>"
    )


def _benefits(s: CostSummary) -> str:
    benefits = s.tco.benefits
    if not benefits:
        return "<p>No plain-decoding requests to compare against: no benefit computed.</p>"
    rows = [
        (
            b.key + (" (primary)" if b.key == s.tco.primary else ""),
            _usd(b.explicit_saving_usd),
            _usd(b.hidden.total_usd),
            _mark(_usd(b.net_usd), bool(b.estimated_from)),
            "never" if b.payback_months is None else f"{b.payback_months:.1f} months",
        )
        for b in benefits
    ]
    table = _table(
        (
            "speculative arm",
            "explicit saving /month",
            "hidden costs /month",
            "net benefit /month",
            "draft training pays back",
        ),
        rows,
    )
    notes = [_estimate_footnote(f"The net benefit of {b.key}", b.estimated_from) for b in benefits]
    return "<h3>Benefit against plain decoding</h3>" + table + _hidden_table(benefits) + "".join(notes)


def _hidden_table(benefits: Sequence[Benefit]) -> str:
    """The hidden monthly costs behind each net benefit, with where incident time came from."""
    rows = [
        (
            b.key,
            _usd(b.hidden.draft_training_usd),
            f"{_usd(b.hidden.monitoring_usd)} ({b.hidden.monitoring_source})",
            f"{_usd(b.hidden.incidents_usd)} ({b.hidden.incidents_source})",
            _usd(b.hidden.opportunity_usd),
            _usd(b.hidden.tech_debt_usd),
            _usd(b.hidden.total_usd),
        )
        for b in benefits
    ]
    head = (
        "hidden costs /month",
        "draft training",
        "monitoring storage",
        "incidents",
        "opportunity",
        "tech-debt reserve",
        "total",
    )
    return _table(head, rows)


def _source_cell(source: str) -> str:
    """An input's source; seed defaults and estimates marked."""
    if source == SEED:
        return SEED_MARK
    return ESTIMATE.replace(">estimate<", f">{escape(source)}<") if "estimate" in source else escape(source)


def _value(a: Assumption) -> str:
    return f"{a.value:,.6g}" if isinstance(a.value, (int, float)) else str(a.value)


def _assumptions(t: Tco) -> str:
    if not t.assumptions:
        return ""
    rows = [(escape(a.name), escape(_value(a)), escape(a.unit), _source_cell(a.source)) for a in t.assumptions]
    return (
        '<div id="assumptions"><h3>Assumptions: every input of the cost model</h3>'
        "<p>Sources: <em>measured</em> (the store, this month), <em>price table</em> (with its date), "
        "<em>config</em>, <em>given</em> (a <code>--hidden-costs</code> file or an override), <em>observed</em> "
        f"(the month's volume), {SEED_MARK} (the seed's figures, neither measured nor given) and {ESTIMATE} "
        "(derived, not metered).</p>" + _table(("input", "value", "unit", "source"), rows, raw=True) + "</div>"
    )


def _concurrency(costs: ConcurrencyCosts | None) -> str:
    head = '<div id="concurrency"><h3>Cost against concurrency</h3>'
    if costs is None or not costs.rows:
        return (
            head + '<p class="empty">No concurrency data: no finished request with device time and output tokens '
            "is held as a raw row this month, so there is no cost per concurrency level to draw.</p></div>"
        )
    rows = [
        (
            r.level,
            r.mode,
            f"{r.requests:,}",
            f"{r.output_tokens:,}",
            _f(r.device_s, ",.1f"),
            _f(r.gpu_hours_per_mtok, ".4g"),
            _usd(r.usd_per_mtok, 4),
            _f(r.acceptance_rate),
        )
        for r in costs.rows
    ]
    return (
        head + f"<p>USD per 1M output tokens at each concurrency level (the power of two nearest the mean number of "
        f"requests in flight during a request's life): device time x ${costs.gpu_hour_usd:.2f}/GPU-hour / output "
        f"tokens, compute only (memory share, energy and retries are in the arm table). "
        f"{escape(_crossover_text(costs))}</p>"
        + _img(plots.concurrency_plot(costs), "USD per 1M output tokens against concurrency, speculative and plain")
        + _table(
            ("level", "mode", "requests", "output tokens", "device s", "GPU-hours /1M", "USD /1M", "acceptance"),
            rows,
        )
        + "</div>"
    )


def _crossover_text(costs: ConcurrencyCosts) -> str:
    """Each drafter on each GPU type: its crossover, stated only where the 95% intervals clear."""
    if not costs.groups:
        return "No crossover can be found: no level has both speculative and plain requests."
    said = [f"{g.drafter or 'speculation'} on {g.gpu_type}: {g.crossover.reason}" for g in costs.groups]
    return "Crossover (per drafter and GPU type): " + "; ".join(said) + "."


def _break_even(s: CostSummary) -> list[str]:
    parts = ["<h3>Break-even</h3>"] if s.break_even else []
    for b in s.break_even:
        parts.append(
            f"<p>{escape(b.key)}: lookahead gamma {_f(b.gamma, '.2f')}, draft cost ratio c {_f(b.draft_cost_ratio)}, "
            f"measured alpha {_f(b.measured_alpha)} (acceptance rate {_f(b.acceptance_rate)}); model speed-up "
            f"{_f(b.model_speedup, '.2f')}x, measured {_f(b.measured_speedup, '.2f')}x. Speed-up 1 at alpha "
            f"{_f(b.speedup_alpha)}; net benefit 0 at alpha {_f(b.benefit_alpha)}. {escape(_verify_text(b))}</p>"
        )
        parts.append(_img(plots.breakeven_plot(b), f"break-even curves of {b.key}"))
    return parts


def _verify_text(b) -> str:
    if b.verify_cost_ratio is None:
        return (
            "Verify cost not measured (no plain arm with timed steps): the model curve takes a verify forward "
            "to cost one plain step (v = 1, the paper's idealisation)."
        )
    return (
        f"Verify cost ratio v = {b.verify_cost_ratio:.2f}x a plain step, measured (seconds per speculative verify "
        "forward / seconds per plain step, this month); the model curve and the break-even alphas use it."
    )


def _tornado(s: CostSummary) -> str:
    base = next((b.net_usd for b in s.tco.benefits if b.key == s.tco.primary), None)
    uri = plots.tornado_plot(s.sensitivity, base)
    return (
        ""
        if uri is None
        else (
            "<h3>Sensitivity: net benefit with each input -20% / +20%</h3>"
            + _img(uri, "sensitivity tornado of the net monthly benefit")
        )
    )


def _advice(s: CostSummary) -> str:
    if not s.advice:
        return ""
    rows = [(r.scenario, r.action, r.rule, r.reason + "".join(f" | {c}" for c in r.contradictions)) for r in s.advice]
    return "<h3>Advice per scenario</h3>" + _table(("scenario", "advice", "rule", "evidence"), rows)


def _notes(r: Report) -> str:
    notes = [*r.notes, *(r.cost.notes if r.headline.requests else ())]
    if not notes:
        return ""
    return _section("notes", "Notes", "<ul>" + "".join(f"<li>{escape(n)}</li>" for n in notes) + "</ul>")


def write_report(report: Report, out_dir: Path) -> tuple[Path, Path]:
    """Write the HTML and JSON files (each atomically: a temporary file, then a rename)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    html_name, json_name = report_names(report.month)
    paths = out_dir / html_name, out_dir / json_name
    for path, content in zip(paths, (render_html(report).encode(), to_json(report))):
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_bytes(content)
        tmp.replace(path)
    return paths
