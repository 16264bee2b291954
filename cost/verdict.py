"""The verdict: is speculation paying now, at the load served, and what does it cost?

One answer, stated the same way by every view (the dashboard's Overview and Cost page, `specwatch cost`,
the advisor, the monthly report, GET /v1/cost). Measured figures and assumed ones are kept apart:

    latency speed-up     plain e2e s/token / speculative e2e s/token, per request: the A/B arms when the
                         window has them, else all requests by mode (then marked biased: the policy may
                         choose the mode by load or prompt length)
    device throughput    speculative ok tokens per device-second / plain's (the TCO's arms)
    $ per 1M tokens      per mode, from the allocation's lines (cost.model)
    measured saving      (plain - speculative) $ per 1M tokens x the observed monthly volume / 1e6
    paying               the measured saving > 0
    fixed costs          draft training, monitoring storage, incidents, opportunity and the reserve
                         (cost.hidden): they never flip a measured answer; they give the break-even
                         volume, fixed $/month / saving per token ("pays above N tokens/month given these
                         assumptions"), marked `estimate` when a default nobody confirmed is among them
    knee                 the concurrency level from which speculation costs more per token, for the drafter
                         and GPU type that served the most speculative tokens (cost.concurrency's crossover:
                         stated only where the 95% intervals clear), its reason otherwise, or "not measured"
"""

from __future__ import annotations

from dataclasses import dataclass

from specwatch.collector.reads.breakdown import Comparison
from specwatch.cost.concurrency import Crossover
from specwatch.cost.model import ArmCost, Tco

PLAIN = "autoregressive"


@dataclass(frozen=True)
class Verdict:
    arm: str | None  # the speculative arm judged (the one that served the most tokens)
    paying: bool | None  # None: not measured (no speculative or no plain arm to compare)
    sentence: str
    latency_speedup: float | None = None
    latency_basis: str | None = None  # "A/B arms" | "by mode (biased)" | None: not measured
    throughput_ratio: float | None = None  # device throughput, speculative / plain
    spec_usd_per_mtok: float | None = None
    plain_usd_per_mtok: float | None = None
    monthly_tokens: float = 0.0
    volume_source: str = "observed"
    saving_usd_per_month: float | None = None  # measured: negative when speculation costs more
    fixed_usd_per_month: float = 0.0
    fixed_estimate: bool = False  # the fixed costs rest on defaults nobody confirmed
    fixed_from: tuple[str, ...] = ()
    break_even_tokens_per_month: float | None = None  # None: no saving per token to cover them
    knee: int | None = None  # concurrency level from which speculation costs more per token
    knee_measured: bool = False  # False: no concurrency table for the window
    knee_reason: str = ""  # the crossover's reason (why none is stated, where none is)
    knee_group: str = ""  # "ngram on H100-SXM": whose crossover it is


def verdict_of(tco: Tco, comparison: Comparison | None = None, knee: Crossover | None = None) -> Verdict:
    """The verdict from the window's TCO, its latency comparison and the main group's concurrency crossover
    (`knee`; None: no concurrency table for the window)."""
    spec, plain = _arm(tco, tco.primary), _arm(tco, PLAIN)
    if spec is None or plain is None:
        missing = "no speculative arm" if spec is None else "no plain-decoding arm"
        return Verdict(tco.primary, None, f"Not measured: {missing} in this window to compare against.")
    per_token = (plain.total_usd_per_mtok - spec.total_usd_per_mtok) / 1e6
    benefit = next((b for b in tco.benefits if b.key == spec.key), None)
    fixed = benefit.hidden.total_usd if benefit else 0.0
    speedup, basis = _latency(comparison)
    found = Verdict(
        arm=spec.key,
        paying=per_token > 0,
        sentence="",
        latency_speedup=speedup,
        latency_basis=basis,
        throughput_ratio=plain.gpu_hours_per_mtok / spec.gpu_hours_per_mtok if spec.gpu_hours_per_mtok else None,
        spec_usd_per_mtok=spec.total_usd_per_mtok,
        plain_usd_per_mtok=plain.total_usd_per_mtok,
        monthly_tokens=tco.monthly_output_tokens,
        volume_source=tco.volume_source,
        saving_usd_per_month=per_token * tco.monthly_output_tokens,
        fixed_usd_per_month=fixed,
        fixed_estimate=bool(benefit and benefit.estimated_from),
        fixed_from=tuple(benefit.estimated_from) if benefit else (),
        break_even_tokens_per_month=fixed / per_token if per_token > 0 else None,
        knee=knee.level if knee else None,
        knee_measured=knee is not None,
        knee_reason=knee.reason if knee else "",
        knee_group=f"{knee.drafter or 'speculation'} on {knee.gpu_type}" if knee else "",
    )
    return Verdict(**{**found.__dict__, "sentence": sentence(found)})


def _arm(tco: Tco, key: str | None) -> ArmCost | None:
    return next((a for a in tco.arms if a.key == key), None)


def _latency(comparison: Comparison | None) -> tuple[float | None, str | None]:
    if comparison is None or comparison.speedup is None:
        return None, None
    return comparison.speedup, "A/B arms" if comparison.by == "arm" else "by mode (biased)"


def sentence(v: Verdict) -> str:
    """The verdict in words: measured first, then what the assumptions add."""
    drafter = v.arm.split(":", 1)[-1] if v.arm else "speculation"
    speed = [
        f"latency {v.latency_speedup:.2f}x ({v.latency_basis})" if v.latency_speedup else "latency not compared",
        f"device throughput {v.throughput_ratio:.2f}x" if v.throughput_ratio else "device throughput not measured",
    ]
    money = (
        f"${v.spec_usd_per_mtok:.4f} against ${v.plain_usd_per_mtok:.4f} plain per 1M tokens, "
        f"{'saving' if v.paying else 'costing'} ${abs(v.saving_usd_per_month):,.2f}/month"
        f" at {v.monthly_tokens:,.0f} tokens/month ({v.volume_source})"
    )
    head = f"Speculation ({drafter}) {'is paying' if v.paying else 'is not paying'} at the load served: "
    return head + f"{', '.join(speed)}; {money}. {_fixed(v)} {_knee(v)}"


def _fixed(v: Verdict) -> str:
    mark = "~" if v.fixed_estimate else ""
    costs = f"{mark}${v.fixed_usd_per_month:,.0f}/month of fixed costs" + (" (estimate)" if v.fixed_estimate else "")
    if v.fixed_usd_per_month <= 0:
        return "No fixed costs assumed."
    if v.break_even_tokens_per_month is None:
        return f"Given {costs}, it does not pay at any volume while it costs more per token."
    return f"Given {costs}, it pays above {mark}{v.break_even_tokens_per_month:,.0f} tokens/month."


def _knee(v: Verdict) -> str:
    if not v.knee_measured:
        return "Knee: not measured."
    if v.knee is None:
        return f"Knee ({v.knee_group}): {v.knee_reason}."
    return f"Knee ({v.knee_group}): speculation costs more per token from concurrency {v.knee}."
