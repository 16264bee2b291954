"""The dashboard's service layer: reads the collector's query API and returns typed values.

No Streamlit here (pages cache these calls through `dashboard.reads`); every function takes a
`View` (time window + filters) where the answer depends on it, and returns a frozen dataclass or
a pandas DataFrame for a chart or a table. Rates are the collector's: it says over how many
seconds of the window it rated (`active_s`), and the dashboard never re-rates.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import pandas as pd

from specwatch.dashboard import formats
from specwatch.dashboard.api import View, get, times


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


@dataclass(frozen=True)
class Quantiles:
    """Seconds at P50 and P99 (None: nothing measured)."""

    p50: float | None
    p99: float | None

    @classmethod
    def of(cls, found: dict) -> Quantiles:
        return cls(found["p50"], found["p99"])


@dataclass(frozen=True)
class Signals:
    """The window's headline figures (`GET /v1/signals`). `request_rate_per_s` and
    `output_tokens_per_s` are the collector's, per second of `active_s` (the part of the window
    with traffic); the other rates divide counts by that same span, never by one of ours."""

    requests: int
    errors: int
    active_s: float
    request_rate_per_s: float
    output_tokens: int
    output_tokens_per_s: float
    drafts: int
    draft_tokens: int
    accepted_tokens: int
    acceptance_rate: float | None
    mean_acceptance_length: float | None
    ttft: Quantiles

    @classmethod
    def of(cls, found: dict) -> Signals:
        figures = {f.name: found[f.name] for f in fields(cls) if f.name != "ttft"}
        return cls(**figures, ttft=Quantiles.of(found["ttft"]))

    def per_s(self, count: int) -> float | None:
        return count / self.active_s if self.active_s else None

    @property
    def accepted_share_of_output(self) -> float | None:
        """The share of output tokens that came from accepted drafts."""
        return self.accepted_tokens / self.output_tokens if self.output_tokens else None


@dataclass(frozen=True)
class Group:
    """One side of a comparison: its requests, their rate and latency per output token."""

    key: str
    requests: int
    request_rate_per_s: float
    output_tokens_per_s: float
    s_per_token: Quantiles

    @classmethod
    def of(cls, found: dict | None) -> Group | None:
        if found is None:
            return None
        rates = (found["request_rate_per_s"], found["output_tokens_per_s"])
        return cls(found["key"], found["requests"], *rates, Quantiles.of(found["s_per_token"]))


@dataclass(frozen=True)
class Comparison:
    """Speculative vs plain: from the A/B arms (`by="arm"`), or by mode, which is biased when the
    policy chose the mode by load or prompt length. `speedup` = plain / speculative s per token."""

    by: str
    speculative: Group | None
    plain: Group | None
    speedup: float | None
    p_value: float | None

    @property
    def biased(self) -> bool:
        return self.by == "mode"

    @property
    def groups(self) -> tuple[Group, ...]:
        return tuple(g for g in (self.speculative, self.plain) if g is not None)

    @property
    def significance(self) -> str:
        return "significant" if self.p_value is not None and self.p_value < 0.05 else "not significant"


@dataclass(frozen=True)
class Alert:
    state: str
    rule: str
    summary: str
    labels: tuple[tuple[str, str], ...]
    value: float | None

    @classmethod
    def of(cls, found: dict) -> Alert:
        summary = found["annotations"].get("summary", "")
        return cls(found["state"], found["rule"], summary, tuple(found["labels"].items()), found["value"])

    @property
    def severity(self) -> str | None:
        return dict(self.labels).get("severity")

    def row(self) -> dict:
        """The alert as a person reads it: state, rule, summary, instance, severity, value."""
        instance = dict(self.labels).get("instance")
        return {"state": self.state, "rule": self.rule, "summary": self.summary, "instance": instance} | {
            "severity": self.severity,
            "value": self.value,
        }

    def internals(self) -> dict:
        """The labels that tell alerts of one rule apart, as `key=value` text."""
        return {"rule": self.rule, "labels": ", ".join(f"{k}={v}" for k, v in self.labels if k != "alertname")}


@dataclass(frozen=True)
class Overview:
    """The Overview page's figures: vLLM's spec-decode panels, the mode share, the speed-up, alerts."""

    signals: Signals
    speculative_share: float | None
    comparison: Comparison
    alerts: tuple[Alert, ...]  # pending and firing

    def count(self, state: str) -> int:
        return sum(a.state == state for a in self.alerts)


def signals(view: View) -> Signals:
    return Signals.of(get("/v1/signals", view.params()))


def labels(view: View) -> dict[str, dict[str, int]]:
    """Requests per instance, model, drafter, mode, arm and scenario in the window."""
    return get("/v1/labels", view.params())


def compare(view: View, arms: dict[str, int] | None = None) -> Comparison:
    """Speculative vs plain: from the A/B arms when there are both, else by mode (biased)."""
    arms = labels(view)["arm"] if arms is None else arms
    by = "arm" if arms.get("spec") and arms.get("control") else "mode"
    found = get("/v1/compare", view.params() | {"by": by})
    groups = (Group.of(found["speculative"]), Group.of(found["plain"]))
    return Comparison(by, *groups, found["speedup"], found["p_value"])


def alerts() -> tuple[Alert, ...]:
    """Every alert the collector holds: firing, pending and recently resolved."""
    return tuple(Alert.of(a) for a in get("/v1/alerts", {"include_resolved": "true"})["alerts"])


def overview(view: View) -> Overview:
    counts = get("/v1/labels", view.params() | {"tags": "none"})  # mode and arm counts only: no sample
    share, total = counts["mode"], sum(counts["mode"].values())
    active = tuple(a for a in alerts() if a.state in ("pending", "firing"))
    speculative = share.get("speculative", 0) / total if total else None
    return Overview(signals(view), speculative, compare(view, counts["arm"]), active)


def series(view: View) -> pd.DataFrame:
    return times(pd.DataFrame(get("/v1/series", view.params() | {"step": view.step_s()})), "t")


def acceptance_series(view: View) -> pd.DataFrame:
    """Acceptance over time with the ±1 stddev band of per-request acceptance, clipped to [0, 1]."""
    frame = series(view)
    if not frame.empty:
        spread = frame["acceptance_rate_stddev"]  # a rate lies in [0, 1]: so does its band
        frame["band_low"] = (frame["acceptance_rate_mean"] - spread).clip(0.0, 1.0)
        frame["band_high"] = (frame["acceptance_rate_mean"] + spread).clip(0.0, 1.0)
    return frame


def positions(view: View) -> pd.DataFrame:
    rates = get("/v1/acceptance/positions", view.params())["rates"]
    return pd.DataFrame({"position": range(1, len(rates) + 1), "acceptance": rates})


@dataclass(frozen=True)
class LengthAcceptance:
    """Acceptance against prompt or output length: Spearman's ρ, the buckets and sampled points."""

    requests: int
    rho: float | None
    p_value: float | None
    buckets: pd.DataFrame
    points: pd.DataFrame


def length_points(view: View, by: str) -> LengthAcceptance:
    found = get("/v1/acceptance/length", view.params() | {"by": by})
    buckets = pd.DataFrame(found["buckets"])
    if not buckets.empty:
        buckets["bucket"] = [f"{b['low']}–{b['high'] or '∞'}" for b in found["buckets"]]
    points = pd.DataFrame(found["points"], columns=["length", "acceptance"])
    return LengthAcceptance(found["requests"], found["spearman_rho"], found["p_value"], buckets, points)


def length_within_scenarios(view: View, by: str) -> pd.DataFrame:
    """Spearman's ρ of acceptance against `by` within each scenario of the window (scenarios differ in
    both prompt length and acceptance, so ρ over all of them together is confounded)."""
    scenarios = sorted(labels(view)["tag:scenario"]) if view.tag is None else []
    rows = []
    for scenario in scenarios:
        found = get("/v1/acceptance/length", view.params() | {"by": by, "tag": f"scenario:{scenario}"})
        if found["requests"]:
            rows.append({"scenario": scenario, "requests": found["requests"], "ρ": found["spearman_rho"],
                         "p": formats.p_value(found["p_value"], "not measured")})  # fmt: skip
    return pd.DataFrame(rows, columns=["scenario", "requests", "ρ", "p"])


def breakdown(view: View, by: str) -> pd.DataFrame:
    """Acceptance, latency and energy per group (`by` = mode | drafter | tag:<key> | ...)."""
    groups = get("/v1/breakdown", view.params() | {"by": by})["groups"]
    return pd.DataFrame([_breakdown_row(g) for g in groups])


def _breakdown_row(g: dict) -> dict:
    return {
        "group": g["key"],
        "requests": g["requests"],
        "errors": g["errors"],
        "acceptance_rate": g["acceptance_rate"],
        "mean_acceptance_length": g["mean_acceptance_length"],
        "ttft_p50_ms": _ms(g["ttft"]["p50"]),
        "ttft_p99_ms": _ms(g["ttft"]["p99"]),
        "ms_per_token_p50": _ms(g["s_per_token"]["p50"]),
        "energy_j_per_token": g["energy_j_per_token"],
        "energy_source": ", ".join(g["energy_sources"]) or None,
    }


def cdfs(view: View, by: str = "mode") -> pd.DataFrame:
    """TTFT and latency-per-token quantiles per group, long format for a CDF chart."""
    data = get("/v1/breakdown", view.params() | {"by": by})
    rows = [
        {"group": g["key"], "metric": metric, "quantile": q, "ms": _ms(v)}
        for g in data["groups"]
        for metric, values in (("TTFT", g["ttft_cdf"]), ("latency per token", g["s_per_token_cdf"]))
        for q, v in zip(data["cdf_points"], values)
        if v is not None
    ]
    return pd.DataFrame(rows)


def throughput_by_load(view: View) -> pd.DataFrame:
    return pd.DataFrame(get("/v1/throughput/by-load", view.params()))


@dataclass(frozen=True)
class EnergyPerToken:
    """Energy per output token per mode (a table), and whether any figure is an estimate."""

    table: pd.DataFrame
    estimated: bool


def power_by_mode(view: View) -> EnergyPerToken:
    """Energy per output token per mode, with where the energy figure came from."""
    frame = breakdown(view, "mode")
    if frame.empty:
        return EnergyPerToken(frame, False)
    estimated = frame["energy_source"].astype(str).str.contains("estimate").any()
    return EnergyPerToken(frame[["group", "requests", "energy_j_per_token", "energy_source"]], bool(estimated))


@dataclass(frozen=True)
class Thresholds:
    """Per signal, the collector's rule that fires first on it (a signal no rule watches is absent)."""

    lines: tuple[formats.Threshold, ...] = ()

    def get(self, signal: str) -> formats.Threshold | None:
        return next((line for line in self.lines if line.signal == signal), None)

    def caption(self, signal: str, what: str) -> str:
        line = self.get(signal)
        return line.caption(what) if line else f"No alert rule is set on {what} in the collector: no line drawn."


def thresholds() -> Thresholds:
    """The lines of `GET /v1/rules`: none when alerting is off in the collector."""
    found: dict[str, formats.Threshold] = {}
    for rule in get("/v1/rules")["rules"]:
        line = formats.Threshold(rule["name"], rule["signal"], rule["op"], rule["threshold"], rule["unit"])
        held = found.get(line.signal)
        if held is None or (line.value < held.value if line.op.startswith(">") else line.value > held.value):
            found[line.signal] = line
    return Thresholds(tuple(found.values()))


def rules() -> pd.DataFrame:
    """The collector's rules with their last evaluation, for the Alerts page."""
    found = get("/v1/rules")["rules"]
    health = {h["rule"]: h for h in get("/v1/alerts", {"include_resolved": "true"})["rules"]}
    return pd.DataFrame([_rule_row(r, health.get(r["name"], {})) for r in found])


def _rule_row(rule: dict, health: dict) -> dict:
    evaluated = health.get("evaluated_at")
    return {
        "rule": rule["name"],
        "fires when": f"{rule['signal']} {rule['op']} {formats.quantity(rule['threshold'], rule['unit'])}",
        "for": formats.duration(rule["for_s"]) if rule["for_s"] else "at once",
        "severity": rule["labels"].get("severity"),
        "last evaluated": None if evaluated is None else pd.to_datetime(evaluated, unit="s", utc=True),
        "error": health.get("error"),
    }


@dataclass(frozen=True)
class FilterOptions:
    """Values seen in the window for each sidebar filter."""

    instance: tuple[str, ...] = ()
    model: tuple[str, ...] = ()
    drafter: tuple[str, ...] = ()
    tag: tuple[str, ...] = ()


def filter_options(seconds: float) -> FilterOptions:
    found = labels(View(seconds))
    names = {name: tuple(sorted(found[name])) for name in ("instance", "model", "drafter")}
    return FilterOptions(**names, tag=tuple(f"scenario:{value}" for value in sorted(found["tag:scenario"])))
