"""The dashboard's service layer: reads the collector's query API over HTTP.

No Streamlit here (pages cache these calls in `dashboard.state`); every function takes a
`View` (time window + filters) and returns plain data or pandas DataFrames. An unreachable
or failing collector raises `CollectorUnavailable` with a message a banner can show; one that
refuses the dashboard's token raises `CollectorRefused`. Requests carry the read token of
`SPECWATCH_READ_TOKEN` (the report download the admin token of `SPECWATCH_ADMIN_TOKEN`), never shown.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import httpx
import pandas as pd

from common.auth import ROLE_ENV
from dashboard import formats

DEFAULT_URL = "http://127.0.0.1:8087"


class CollectorUnavailable(RuntimeError):
    pass


class CollectorRefused(CollectorUnavailable):
    """401/403: the collector wants a (different) token; a configuration problem, not an outage."""


def auth_headers(role: str = "read") -> dict[str, str]:
    """The Authorization header for `role`'s token (admin: else the read token), none when unset."""
    names = [ROLE_ENV[role]] + ([ROLE_ENV["read"]] if role == "admin" else [])
    token = next((os.environ[name].split(",")[0].strip() for name in names if os.environ.get(name)), "")
    return {"authorization": f"Bearer {token}"} if token else {}


def _checked(response: httpx.Response, what: str, role: str = "read") -> httpx.Response:
    """The response if 200; else CollectorRefused (401/403, the collector's message: never the token)
    or CollectorUnavailable."""
    if response.status_code in (401, 403):
        try:
            reason = response.json()["detail"]["message"]
        except (ValueError, KeyError, TypeError):
            reason = response.text[:300]
        raise CollectorRefused(
            f"the collector answered {response.status_code} for {what}: {reason}. "
            f"Set {ROLE_ENV[role]} to one of its {role} tokens and restart the dashboard."
        )
    if response.status_code != 200:
        raise CollectorUnavailable(f"the collector answered {response.status_code} for {what}: {response.text[:300]}")
    return response


def collector_url() -> str:
    return os.environ.get("SPECWATCH_COLLECTOR_URL", DEFAULT_URL).rstrip("/")


@dataclass(frozen=True)
class View:
    """What the sidebar selected: the last `seconds` and the request filters (None: all)."""

    seconds: float = 900.0
    instance: str | None = None
    model: str | None = None
    drafter: str | None = None
    mode: str | None = None
    arm: str | None = None
    tag: str | None = None  # "key:value"

    def params(self, with_filters: bool = True) -> dict:
        params: dict = {"last": self.seconds}
        if with_filters:
            params |= {k: v for k in ("instance", "model", "drafter", "mode", "arm", "tag") if (v := getattr(self, k))}
        return params

    def step_s(self) -> float:
        """About 60 points per chart, in whole minutes."""
        return max(60.0, round(self.seconds / 60 / 60) * 60)


def get(path: str, params: dict | None = None, base_url: str | None = None) -> object:
    url = f"{base_url or collector_url()}{path}"
    try:
        response = httpx.get(url, params=params, headers=auth_headers(), timeout=15.0)
    except httpx.HTTPError as exc:
        raise CollectorUnavailable(f"cannot reach the collector at {base_url or collector_url()}: {exc}") from None
    return _checked(response, path).json()


def signals(view: View, **extra) -> dict:
    return get("/v1/signals", view.params() | extra)


def labels(view: View) -> dict[str, dict[str, int]]:
    """Requests per instance, model, drafter, mode, arm and scenario in the window."""
    return get("/v1/labels", view.params())


def series(view: View) -> pd.DataFrame:
    frame = pd.DataFrame(get("/v1/series", view.params() | {"step": view.step_s()}))
    if not frame.empty:
        frame["time"] = pd.to_datetime(frame["t"], unit="s", utc=True)
    return frame


def positions(view: View) -> pd.DataFrame:
    data = get("/v1/acceptance/positions", view.params())
    return pd.DataFrame({"position": range(1, len(data["rates"]) + 1), "acceptance": data["rates"]})


def acceptance_vs_length(view: View, by: str) -> dict:
    return get("/v1/acceptance/length", view.params() | {"by": by})


def breakdown(view: View, by: str) -> pd.DataFrame:
    groups = get("/v1/breakdown", view.params() | {"by": by})["groups"]
    rows = [
        {
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
        for g in groups
    ]
    return pd.DataFrame(rows)


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


def compare(view: View, arms: dict[str, int] | None = None) -> dict:
    """Speculative vs plain: from the A/B arms when there are both, else by mode (marked biased)."""
    arms = labels(view)["arm"] if arms is None else arms
    by = "arm" if arms.get("spec") and arms.get("control") else "mode"
    return get("/v1/compare", view.params() | {"by": by}) | {"biased": by == "mode"}


def throughput_by_load(view: View) -> pd.DataFrame:
    return pd.DataFrame(get("/v1/throughput/by-load", view.params()))


def device_series(view: View) -> pd.DataFrame:
    params = view.params(with_filters=False) | ({"instance": view.instance} if view.instance else {})
    frame = pd.DataFrame(get("/v1/devices/series", params))
    if not frame.empty:
        frame["time"] = pd.to_datetime(frame["at"], unit="s", utc=True)
    return frame


def devices_latest() -> list[dict]:
    return get("/v1/devices/latest")


def events(view: View, kind: str | None = None) -> pd.DataFrame:
    params = view.params(with_filters=False) | ({"kind": kind} if kind else {})
    frame = pd.DataFrame(get("/v1/events", params))
    if not frame.empty:
        frame["time"] = pd.to_datetime(frame["at"], unit="s", utc=True)
    return frame


def alerts() -> dict:
    return get("/v1/alerts", {"include_resolved": "true"})


def thresholds() -> dict[str, formats.Threshold]:
    """Per signal, the threshold of the collector's rule that fires first (`GET /v1/rules`).
    A signal no rule watches is absent, and so is every signal when alerting is off there."""
    found: dict[str, formats.Threshold] = {}
    for rule in get("/v1/rules")["rules"]:
        line = formats.Threshold(rule["name"], rule["signal"], rule["op"], rule["threshold"], rule["unit"])
        held = found.get(line.signal)
        if held is None or (line.value < held.value if line.op.startswith(">") else line.value > held.value):
            found[line.signal] = line
    return found


def threshold_caption(thresholds: dict[str, formats.Threshold], signal: str, what: str) -> str:
    line = thresholds.get(signal)
    return line.caption(what) if line else f"No alert rule is set on {what} in the collector: no line drawn."


def rules() -> pd.DataFrame:
    """The collector's rules with their last evaluation, for the Alerts page."""
    found, health = get("/v1/rules"), {h["rule"]: h for h in alerts()["rules"]}
    rows = [
        {
            "rule": r["name"],
            "fires when": f"{r['signal']} {r['op']} {formats.quantity(r['threshold'], r['unit'])}",
            "for": formats.duration(r["for_s"]) if r["for_s"] else "at once",
            "severity": r["labels"].get("severity"),
            "last evaluated": pd.to_datetime(health[r["name"]]["evaluated_at"], unit="s", utc=True)
            if r["name"] in health
            else None,
            "error": health.get(r["name"], {}).get("error"),
        }
        for r in found["rules"]
    ]
    return pd.DataFrame(rows)


def alert_history(view: View) -> dict[str, pd.DataFrame]:
    found = get("/v1/alerts/history", view.params(with_filters=False))
    frames = {}
    for name, rows in found.items():
        frame = pd.DataFrame(rows)
        if not frame.empty:
            time_column = "created_at" if name == "notifications" else "at"
            frame.insert(0, "time", pd.to_datetime(frame[time_column], unit="s", utc=True))
        frames[name] = frame
    return frames


def sources(view: View) -> pd.DataFrame:
    """One row per source (kind engine, vllm, gateway or upstream); `last_seen` and, for gateways and
    upstreams, `reported` (their latest health snapshot) as UTC times."""
    frame = pd.DataFrame(get("/v1/sources", view.params(with_filters=False)))
    if not frame.empty:
        frame["last_seen"] = pd.to_datetime(frame["last_seen_at"], unit="s", utc=True)
        if "reported_at" in frame:  # a collector from before gateways sends no such column
            frame["reported"] = pd.to_datetime(frame["reported_at"], unit="s", utc=True)
    return frame


def vllm_signals(view: View) -> dict:
    return get("/v1/vllm/signals", view.params(with_filters=False))


def filter_options(seconds: float) -> dict[str, list[str]]:
    """Values seen in the window for each sidebar filter."""
    found = labels(View(seconds))
    return {
        "instance": sorted(found["instance"]),
        "model": sorted(found["model"]),
        "drafter": sorted(found["drafter"]),
        "tag": [f"scenario:{value}" for value in sorted(found["tag:scenario"])],
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else seconds * 1000.0


def overview(view: View) -> dict:
    """The Overview page's headline figures (vLLM's spec-decode panels plus the speed-up).
    Rates are per second of `active_span_s`, not of the whole window."""
    s, counts = signals(view), labels(view)
    share, comparison = counts["mode"], compare(view, counts["arm"])
    active = [a for a in alerts()["alerts"] if a["state"] in ("pending", "firing")]
    span, total = active_span_s(view, series(view)), sum(share.values())
    output_tokens = s["output_tokens_per_s"] * view.seconds  # the collector rates over the whole window
    return {
        "requests": s["requests"],
        "span_s": span,
        "requests_per_s": s["requests"] / span,
        "output_tokens_per_s": output_tokens / span,
        "speculative_share": share.get("speculative", 0) / total if total else None,
        "acceptance_rate": s["acceptance_rate"],
        "mean_acceptance_length": s["mean_acceptance_length"],
        "drafts_per_s": s["drafts"] / span,
        "draft_tokens_per_s": s["draft_tokens"] / span,
        "accepted_tokens_per_s": s["accepted_tokens"] / span,
        "accepted_share_of_output": s["accepted_tokens"] / output_tokens if output_tokens else None,
        "ttft_p50": s["ttft"]["p50"],
        "ttft_p99": s["ttft"]["p99"],
        "errors": s["errors"],
        "firing": sum(a["state"] == "firing" for a in active),
        "pending": sum(a["state"] == "pending" for a in active),
        "active_alerts": active,
        "speedup": comparison["speedup"],
        "speedup_p_value": comparison["p_value"],
        "speedup_biased": comparison["biased"],
    }


def active_span_s(view: View, frame: pd.DataFrame) -> float:
    """Seconds of the window that hold requests: from the first step with any to the end of the last,
    at least one step. A run 4 minutes old is rated over those minutes, not diluted over the hour."""
    step = view.step_s()
    busy = frame["t"][frame["requests"] > 0] if not frame.empty else frame
    if busy.empty:
        return view.seconds
    return min(view.seconds, max(step, float(busy.max() - busy.min()) + step))


def length_points(view: View, by: str) -> tuple[dict, pd.DataFrame, pd.DataFrame]:
    """Acceptance vs prompt/output length: the correlation, the buckets and sampled points."""
    found = acceptance_vs_length(view, by)
    buckets = pd.DataFrame(found["buckets"])
    if not buckets.empty:
        buckets["bucket"] = [f"{b['low']}–{b['high'] or '∞'}" for b in found["buckets"]]
    points = pd.DataFrame(found["points"], columns=["length", "acceptance"])
    return {"requests": found["requests"], "rho": found["spearman_rho"], "p": found["p_value"]}, buckets, points


def acceptance_series(view: View) -> pd.DataFrame:
    """Acceptance over time with the ±1 stddev band of per-request acceptance."""
    frame = series(view)
    if not frame.empty:
        frame["band_low"] = frame["acceptance_rate_mean"] - frame["acceptance_rate_stddev"]
        frame["band_high"] = frame["acceptance_rate_mean"] + frame["acceptance_rate_stddev"]
    return frame


def power_by_mode(view: View) -> pd.DataFrame:
    """Energy per output token per mode, with where the energy figure came from."""
    frame = breakdown(view, "mode")
    return frame[["group", "requests", "energy_j_per_token", "energy_source"]] if not frame.empty else frame


COST_INPUTS = (
    "gpu_hour_usd",
    "electricity_usd_per_kwh",
    "pue",
    "monthly_output_tokens",
    "draft_training_usd",
    "amortisation_months",
    "incident_days_per_week",
    "opportunity_days_per_month",
    "tech_debt_buffer",
    "pricing",
    "idle_allocation",
)


def cost(view: View, gpu_type: str | None = None, overrides: tuple[tuple[str, float], ...] = ()) -> dict:
    """The cost model over the window (`GET /v1/cost`) with what-if inputs, as tables for the Cost page."""
    params = view.params() | ({"gpu_type": gpu_type} if gpu_type else {}) | dict(overrides)
    found = get("/v1/cost", params)
    tco = found["tco"]
    arms = pd.DataFrame(
        [
            {
                "arm": a["key"],
                "$ / 1M tokens": a["total_usd_per_mtok"],
                "compute $": a["compute_usd_per_mtok"],
                "energy $": a["energy_usd_per_mtok"],
                "energy source": a["energy_source"],
                "energy added": a["energy_added"],
                "retries $": a["retries_usd_per_mtok"],
                "idle $ (by share)": a["idle_usd_per_mtok"],
                "GPU-hours / 1M tokens": a["gpu_hours_per_mtok"],
                "device time from": a["device_s_source"],
                "memory share": a["memory_share"],
                "monthly $": a["monthly_usd"],
            }
            for a in tco["arms"]
        ]
    )
    benefits = pd.DataFrame(
        [
            {
                "drafter arm": b["key"],
                "explicit saving $/month": b["explicit_saving_usd"],
                "draft training $/month": b["hidden"]["draft_training_usd"],
                "monitoring $/month": b["hidden"]["monitoring_usd"],
                "incidents $/month": b["hidden"]["incidents_usd"],
                "opportunity $/month": b["hidden"]["opportunity_usd"],
                "tech-debt reserve $/month": b["hidden"]["tech_debt_usd"],
                "net $/month": b["net_usd"],
                "estimated from": ", ".join(b["estimated_from"]),
                "payback (months)": b["payback_months"],
            }
            for b in tco["benefits"]
        ]
    )
    assumptions = pd.DataFrame(
        [
            {"input": a["name"], "value": a["value"], "unit": a["unit"], "source": a["source"]}
            for a in tco["assumptions"]
        ]
    ).astype({"value": str}, errors="ignore")
    concurrency = found.get("concurrency") or {"rows": [], "crossover": None}
    curves = pd.DataFrame(
        [
            {"arm": b["key"], "acceptance": alpha, "speed-up": speedup, "net $/month": net}
            for b in found["break_even"]
            for alpha, speedup, net in b["curve"]
        ]
    )
    return {
        "summary": found,
        "arms": arms,
        "benefits": benefits,
        "curves": curves,
        "tornado": pd.DataFrame(found["sensitivity"]),
        "advice": pd.DataFrame(found["advice"]),
        "assumptions": assumptions,
        "concurrency": pd.DataFrame(concurrency["rows"]),
        "crossover": concurrency["crossover"],
    }


def cost_daily(days: int) -> dict:
    """$ per 1M output tokens per UTC day and arm over the last `days` (`GET /v1/cost/daily`):
    the rows as a frame (a `time` column for charts), the GPU priced, and one note per arm whose
    figures are estimates, saying what was estimated and on how many days."""
    found = get("/v1/cost/daily", {"days": days})
    frame = pd.DataFrame(found["rows"])
    notes = []
    if not frame.empty:
        frame["time"] = pd.to_datetime(frame["start"], unit="s", utc=True)
        frame["estimated"] = frame["estimated"].map(", ".join)
        for (arm, what), group in frame[frame["estimate"]].groupby(["arm", "estimated"]):
            notes.append(f"{arm}: {what} on {len(group)} of {int((frame['arm'] == arm).sum())} days")
    return {"gpu_type": found["gpu_type"], "gpu_type_source": found["gpu_type_source"], "rows": frame, "notes": notes}


def report_html(month: str) -> bytes:
    """A month's self-contained HTML cost-benefit report, built by the collector."""
    url = f"{collector_url()}/v1/report"
    try:
        response = httpx.get(url, params={"month": month}, headers=auth_headers("admin"), timeout=120.0)
    except httpx.HTTPError as exc:
        raise CollectorUnavailable(f"cannot reach the collector at {collector_url()}: {exc}") from None
    return _checked(response, "the report", "admin").content
