"""The Memory & power and Sources pages' reads: device samples, engine events, telemetry sources
(engines, gateways with their upstreams' health, vLLM servers) and vLLM's scraped signals.

No Streamlit here (pages cache these calls through `dashboard.reads`). Rates are the collector's.
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from specwatch.dashboard.api import CollectorRefused, View, get, times

ENGINE_COLUMNS = ["kind", "name", "last_seen", "records_in_window", "per_s"]
MIB = 2**20


def _device_params(view: View) -> dict:
    return view.params(with_filters=False) | ({"instance": view.instance} if view.instance else {})


def device_series(view: View) -> pd.DataFrame:
    """Device samples in the window, oldest first, with a UTC `time` column."""
    return times(pd.DataFrame(get("/v1/devices/series", _device_params(view))), "at")


def events(view: View, kind: str | None = None) -> pd.DataFrame:
    """Engine events in the window (`kind`: only those), with a UTC `time` column."""
    params = view.params(with_filters=False) | ({"kind": kind} if kind else {})
    return times(pd.DataFrame(get("/v1/events", params)), "at")


def deploy_markers(view: View) -> pd.DataFrame:
    """The `config` events (deploy markers: an engine's version, model and drafter at start or on a change,
    a gateway's record of an upstream's vLLM version) in the window, of the view's instance when one is
    picked; none for a tenant-bound token (the collector refuses it events, which carry no tenant)."""
    params = _device_params(view) | {"kind": "config"}
    try:
        return times(pd.DataFrame(get("/v1/events", params)), "at")
    except CollectorRefused:
        return pd.DataFrame()


@dataclass(frozen=True)
class Devices:
    """What the Memory & power page shows: the samples, memory held (long format, MiB), the latest
    sample's figures, the draft's utilisation swing and whether any power figure is an estimate."""

    samples: pd.DataFrame
    memory: pd.DataFrame
    fragmentation: float | None
    reserved_mib: float | None
    power_w: float | None
    power_source: str | None
    draft_swing_pp: float | None
    power_estimated: bool

    @property
    def empty(self) -> bool:
        return self.samples.empty


def devices(view: View) -> Devices:
    samples = device_series(view)
    if samples.empty:
        return Devices(samples, samples, None, None, None, None, None, False)
    latest = samples.iloc[-1]
    draft = samples["util_draft"]
    return Devices(
        samples=samples,
        memory=_memory(samples),
        fragmentation=_number(latest["fragmentation"]),
        reserved_mib=_number(latest["mem_reserved_bytes"] / MIB),
        power_w=_number(latest["power_w"]),
        power_source=latest["power_source"],
        draft_swing_pp=float(draft.max() - draft.min()) * 100 if draft.notna().any() else None,
        power_estimated=bool((samples["power_source"] == "estimate").any()),
    )


def _number(value: object) -> float | None:
    return None if pd.isna(value) else float(value)


def _memory(samples: pd.DataFrame) -> pd.DataFrame:
    kinds = {"mem_allocated_bytes": "allocated", "mem_reserved_bytes": "reserved"}
    memory = samples.melt(id_vars=["time"], value_vars=list(kinds), var_name="kind", value_name="bytes")
    memory["MiB"] = memory["bytes"] / MIB
    memory["kind"] = memory["kind"].map(kinds)
    return memory


@dataclass(frozen=True)
class Gateway:
    """One gateway: its latest health report, its requests in the window (those no upstream took
    included) and its upstreams as a table."""

    name: str
    reported: pd.Timestamp
    requests: int
    per_s: float
    upstreams: pd.DataFrame
    down: int


@dataclass(frozen=True)
class Sources:
    """Engines and vLLM servers (a table), and gateways with their upstreams."""

    direct: pd.DataFrame
    gateways: tuple[Gateway, ...]


def sources(view: View) -> Sources:
    """`GET /v1/sources`, with `last_seen` and (gateways, upstreams) `reported` as UTC times."""
    found = times(pd.DataFrame(get("/v1/sources", view.params(with_filters=False))), "last_seen_at", "last_seen")
    if found.empty:
        return Sources(pd.DataFrame(columns=ENGINE_COLUMNS), ())
    found = times(found, "reported_at", "reported")
    direct = found[found["kind"].isin(["engine", "vllm"])][ENGINE_COLUMNS]
    gateways = found[found["kind"] == "gateway"]
    return Sources(direct, tuple(_gateway(g, found) for g in gateways.itertuples()))


def _gateway(gateway, found: pd.DataFrame) -> Gateway:
    upstreams = found[(found["kind"] == "upstream") & (found["gateway"] == gateway.name)]
    table = upstream_table(upstreams)
    down = int(table["health"].str.startswith("down").sum())
    return Gateway(gateway.name, gateway.reported, gateway.records_in_window, gateway.per_s, table, down)


def health(row: pd.Series) -> str:
    """ "up", "down: <reason>", or "unknown" when the snapshot did not say."""
    if pd.isna(row["healthy"]):
        return "unknown"
    reason = row["reason"] if isinstance(row["reason"], str) and row["reason"] else "no reason given"
    return "up" if bool(row["healthy"]) else f"down: {reason}"


def upstream_table(upstreams: pd.DataFrame) -> pd.DataFrame:
    return pd.DataFrame(
        {
            "upstream": upstreams["name"],
            "pool": upstreams["pool"],
            "drafter": upstreams["drafter"].fillna("none"),
            "health": upstreams.apply(health, axis=1) if not upstreams.empty else pd.Series(dtype=str),
            "requests": upstreams["records_in_window"],
            "req/s": upstreams["per_s"],
            "last health report": upstreams["reported"],
        }
    )


@dataclass(frozen=True)
class VllmSignals:
    """vLLM's own spec-decode figures from its scraped /metrics (`intervals` = 0: none scraped)."""

    intervals: int
    acceptance_rate: float | None
    mean_acceptance_length: float | None
    ttft_p99: float | None


def vllm_signals(view: View) -> VllmSignals:
    found = get("/v1/vllm/signals", view.params(with_filters=False))
    figures = (found["acceptance_rate"], found["mean_acceptance_length"], found["ttft"]["p99"])
    return VllmSignals(found["intervals"], *figures)


@dataclass(frozen=True)
class SampledEnergy:
    """Energy over the window from the device samples' power, and the output tokens served meanwhile."""

    joules: float | None  # None: no sample carried power
    output_tokens: int
    estimated: bool  # some power figure was an estimate (no NVML or RAPL reading)

    @property
    def per_token(self) -> float | None:
        return self.joules / self.output_tokens if self.joules is not None and self.output_tokens else None


def sampled_energy(view: View) -> SampledEnergy:
    """Σ power x the time each sample stands for (the gap to the instance's next sample, at most
    `MAX_GAP` sampling intervals, so a pause is not billed as busy), over the instance's output tokens.
    All modes together: the samples cannot tell speculative from plain work apart."""
    samples = device_series(view)
    tokens = get("/v1/signals", _device_params(view))["output_tokens"]
    if samples.empty or samples["power_w"].isna().all():
        return SampledEnergy(None, tokens, False)
    joules = sum(_joules(group) for _, group in samples.dropna(subset=["power_w"]).groupby("instance"))
    return SampledEnergy(joules, tokens, bool((samples["power_source"] == "estimate").any()))


MAX_GAP = 3.0


def _joules(samples: pd.DataFrame) -> float:
    at = samples["at"].to_numpy(dtype=float)
    if len(at) < 2:
        return 0.0
    gaps = pd.Series(at).diff().shift(-1)
    typical = float(gaps.median())
    gaps = gaps.fillna(typical).clip(upper=MAX_GAP * typical)
    return float((samples["power_w"].to_numpy(dtype=float) * gaps.to_numpy()).sum())
