"""The monthly report's plots: matplotlib figures as SVG data URIs (the HTML needs no network).

Each function takes a part of `report.build.Report` and returns a `data:image/svg+xml;base64,`
URI, or None when there is nothing to draw. Text stays text in the SVG (`svg.fonttype: none`);
no dates or random ids are written, so the same report draws the same bytes.
"""

from __future__ import annotations

import base64
import io
from collections.abc import Sequence

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from specwatch.collector.reads.breakdown import Comparison, LoadBucket  # noqa: E402
from specwatch.collector.reads.queries import HourOfDay, LengthBucket  # noqa: E402
from specwatch.cost.breakeven import BreakEven, TornadoRow  # noqa: E402
from specwatch.cost.concurrency import ConcurrencyCosts  # noqa: E402

SPEC, PLAIN, ACCENT, GREY = "#1f77b4", "#ff7f0e", "#d62728", "#7f7f7f"
_STYLE = {
    "svg.fonttype": "none",
    "svg.hashsalt": "specwatch",
    "font.size": 9,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.grid": True,
    "grid.alpha": 0.3,
    # Titles and legends carry producers' strings (an arm's drafter `model:NAME`): text, never mathtext
    # (`$...$` would be typeset, and a malformed one would fail the whole report).
    "text.parse_math": False,
}
SIZE = (6.4, 3.2)  # inches


def to_data_uri(fig: Figure) -> str:
    buffer = io.BytesIO()
    fig.savefig(buffer, format="svg", bbox_inches="tight", metadata={"Date": None, "Creator": "specwatch"})
    plt.close(fig)
    return "data:image/svg+xml;base64," + base64.b64encode(buffer.getvalue()).decode("ascii")


def _figure(ncols: int = 1, size: tuple[float, float] = SIZE):
    """A figure (call inside `plt.rc_context(_STYLE)`)."""
    return plt.subplots(1, ncols, figsize=size, layout="constrained")


def daily_plot(days: Sequence) -> str | None:
    """Requests per day (bars) and the day's acceptance rate (line, right axis)."""
    if not any(d.requests for d in days):
        return None
    with plt.rc_context(_STYLE):
        fig, ax = _figure()
        x = range(len(days))
        ax.bar(x, [d.requests for d in days], color=GREY, alpha=0.5, label="requests")
        ax.set_ylabel("requests per day")
        step = max(1, len(days) // 6)
        ax.set_xticks(list(x)[::step], [d.day[5:] for d in days][::step])
        right = ax.twinx()
        rate = [float("nan") if d.acceptance_rate is None else d.acceptance_rate for d in days]
        right.plot(x, rate, "o-", color=SPEC, label="acceptance rate")
        right.set_ylim(0, 1)
        right.set_ylabel("acceptance rate")
        right.grid(False)
        fig.legend(loc="outside upper center", ncols=2, frameon=False)
    return to_data_uri(fig)


def length_plot(buckets: Sequence[LengthBucket]) -> str | None:
    """Acceptance rate per prompt-length bucket, with the requests in each."""
    shown = [b for b in buckets if b.requests]
    if not shown:
        return None
    with plt.rc_context(_STYLE):
        fig, ax = _figure()
        labels = [f"{b.low}-{b.high}" if b.high is not None else f">={b.low}" for b in shown]
        bars = ax.bar(labels, [b.acceptance_rate or 0.0 for b in shown], color=SPEC)
        ax.bar_label(bars, [f"n={b.requests}" for b in shown], fontsize=7)
        ax.set_ylim(0, 1.1)
        ax.set_xlabel("prompt tokens")
        ax.set_ylabel("acceptance rate")
    return to_data_uri(fig)


def latency_plot(comparison: Comparison) -> str | None:
    """TTFT and seconds per output token at p50/p90/p99, speculative against plain."""
    groups = [
        (name, g, color)
        for name, g, color in (("speculative", comparison.speculative, SPEC), ("plain", comparison.plain, PLAIN))
        if g is not None
    ]
    if not groups:
        return None
    with plt.rc_context(_STYLE):
        fig, axes = _figure(2, (7.2, 3.0))
        for ax, metric, title in ((axes[0], "ttft", "TTFT (s)"), (axes[1], "s_per_token", "e2e s per output token")):
            width = 0.8 / len(groups)
            for i, (name, group, color) in enumerate(groups):
                p = getattr(group, metric)
                values = [v or 0.0 for v in (p.p50, p.p90, p.p99)]
                ax.bar([j + i * width for j in range(3)], values, width, color=color, label=name)
            ax.set_xticks([j + width * (len(groups) - 1) / 2 for j in range(3)], ["p50", "p90", "p99"])
            ax.set_title(title)
        axes[0].legend(frameon=False)
    return to_data_uri(fig)


def load_plot(buckets: Sequence[LoadBucket], knee: dict[str, float | None]) -> str | None:
    """Per-request decode speed by load at admission, per mode; knees marked."""
    if not buckets:
        return None
    with plt.rc_context(_STYLE):
        fig, ax = _figure()
        for mode, color in (("speculative", SPEC), ("autoregressive", PLAIN)):
            rows = sorted((b for b in buckets if b.mode == mode and b.tokens_per_s is not None), key=lambda b: b.low)
            if rows:
                ax.plot([b.low for b in rows], [b.tokens_per_s for b in rows], "o-", color=color, label=mode)
            if knee.get(mode) is not None:
                ax.axvline(knee[mode], color=color, linestyle=":", label=f"{mode} knee")
        ax.set_xlabel("load at admission (busy + queued) / slots, bucket lower bound")
        ax.set_ylabel("output tokens/s per request")
        ax.legend(frameon=False)
    return to_data_uri(fig)


def hours_plot(hours: Sequence[HourOfDay]) -> str | None:
    """Requests, errors and OOMs by UTC hour of day."""
    if not any(h.requests for h in hours):
        return None
    with plt.rc_context(_STYLE):
        fig, ax = _figure()
        x = [h.hour for h in hours]
        ax.bar(x, [h.requests for h in hours], color=GREY, alpha=0.3, label="requests")
        ax.bar(x, [h.errors for h in hours], color=GREY, label="errors")
        ax.bar(x, [h.ooms for h in hours], color=ACCENT, label="OOMs")
        ax.set_xticks(range(0, 24, 2))
        ax.set_xlabel("hour of day (UTC)")
        ax.set_ylabel("requests")
        fig.legend(loc="outside upper center", ncols=3, frameon=False)
    return to_data_uri(fig)


def breakeven_plot(b: BreakEven) -> str | None:
    """Expected speed-up and net monthly benefit over the acceptance alpha; measured alpha and
    the two break-even points marked."""
    if not any(s is not None for _, s, _ in b.curve):
        return None
    alpha = [a for a, _, _ in b.curve]
    with plt.rc_context(_STYLE):
        fig, axes = _figure(2, (7.2, 3.0))
        axes[0].plot(alpha, [float("nan") if s is None else s for _, s, _ in b.curve], color=SPEC)
        axes[0].axhline(1.0, color=GREY, linewidth=0.8)
        axes[0].set_ylabel("expected speed-up (x)")
        axes[1].plot(alpha, [float("nan") if n is None else n for _, _, n in b.curve], color=SPEC)
        axes[1].axhline(0.0, color=GREY, linewidth=0.8)
        axes[1].set_ylabel("net benefit (USD/month)")
        for ax, even in ((axes[0], b.speedup_alpha), (axes[1], b.benefit_alpha)):
            ax.set_xlabel("acceptance alpha per drafted token")
            if b.measured_alpha is not None:
                ax.axvline(b.measured_alpha, color=ACCENT, label=f"measured {b.measured_alpha:.2f}")
            if even is not None:
                ax.axvline(even, color=GREY, linestyle="--", label=f"break-even {even:.2f}")
            ax.legend(frameon=False, fontsize=7)
        fig.suptitle(b.key)
    return to_data_uri(fig)


def tornado_plot(rows: Sequence[TornadoRow], base: float | None, top: int = 10) -> str | None:
    """Net monthly benefit with each input at -20% and +20%, widest swing on top."""
    rows = list(rows)[:top]
    if not rows or base is None:
        return None
    with plt.rc_context(_STYLE):
        fig, ax = _figure(1, (6.4, 0.35 * len(rows) + 1.0))
        y = list(range(len(rows)))[::-1]
        for yi, r in zip(y, rows):
            ax.barh(yi, r.net_at_low - base, left=base, color=PLAIN, label="input -20%" if yi == y[0] else None)
            ax.barh(yi, r.net_at_high - base, left=base, color=SPEC, label="input +20%" if yi == y[0] else None)
        ax.axvline(base, color="black", linewidth=0.8)
        ax.set_yticks(y, [r.name for r in rows])
        ax.set_xlabel("net benefit (USD/month)")
        ax.legend(frameon=False, fontsize=7)
    return to_data_uri(fig)


def bill_plot(parts: dict[str, float]) -> str | None:
    """The bill as one stacked bar: arms, retries, idle and other tenants."""
    if not parts or sum(parts.values()) <= 0:
        return None
    with plt.rc_context(_STYLE):
        fig, ax = _figure(size=(SIZE[0], 1.6))
        left = 0.0
        for name, usd in sorted(parts.items()):
            ax.barh(0, usd, left=left, label=name)
            left += usd
        ax.set_yticks([])
        ax.set_xlabel("USD over the period (Σ = the bill)")
        ax.legend(frameon=False, ncol=3, fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.6))
    return to_data_uri(fig)


def concurrency_plot(costs: ConcurrencyCosts | None) -> str | None:
    """USD per 1M output tokens against the concurrency level, one line per mode (log2 x axis);
    the crossover (from where speculation costs more) marked."""
    if costs is None or not costs.rows:
        return None
    levels = sorted({row.level for row in costs.rows})
    with plt.rc_context(_STYLE):
        fig, ax = _figure()
        for mode, color in (("speculative", SPEC), ("autoregressive", PLAIN)):
            rows = sorted((r for r in costs.rows if r.mode == mode), key=lambda r: r.level)
            if rows:
                ax.plot([r.level for r in rows], [r.usd_per_mtok for r in rows], "o-", color=color, label=mode)
                low = [(r.level, r.usd_low, r.usd_high) for r in rows if r.usd_low is not None]
                if low:
                    x, lo, hi = zip(*low)
                    ax.fill_between(x, lo, hi, color=color, alpha=0.15)
        if costs.crossover is not None:
            ax.axvline(costs.crossover, color=ACCENT, linestyle="--", label=f"crossover: level {costs.crossover}")
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(level) for level in levels])
        ax.minorticks_off()
        ax.set_ylim(bottom=0)
        ax.set_xlabel("concurrency level (requests in flight)")
        ax.set_ylabel("USD per 1M output tokens")
        ax.legend(frameon=False)
    return to_data_uri(fig)
