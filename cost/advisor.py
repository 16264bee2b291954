"""Should speculation be on for this workload? Per scenario: enable, disable or canary, with evidence.

`scenario_evidence` measures each scenario (the `scenario` tag) from the store; `recommend`
is a pure function of that evidence. Guidance first, then the measurements:

    guidance enable   latency-sensitive chat, or short work (p90 of prompt + output < 512
                      tokens), when memory is ample (>= 20% headroom) or not measured
    guidance disable  edge devices (<= 16 GiB), memory beyond one device, contexts > 128K
                      (median prompt + output)
    measured          pays: speed-up >= 1.05 with p < 0.05; hurts: <= 0.95 with p < 0.05

    guidance \\ measured   pays                hurts               unclear / not compared
    enable                enable              disable (contra)    enable if the point estimate is >= 1
                                                                  or absent, else canary
    disable               canary (contra)     disable             disable
    none                  enable              disable             canary

Fewer than `min_requests` requests, or none speculative: canary. Contradictions between
guidance and data are stated with their numbers, and so is a determinism requirement on
greedy requests (greedy speculation is token-identical: no reason to disable).

Determinism, sampling and latency needs are read from request tags (the telemetry contract
carries no sampling parameters): `determinism` = required|true|yes|1|strict, `temperature`
(0 = greedy) or `sampling` (= greedy), `latency` = sensitive|interactive|realtime|high.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from sqlalchemy import Engine

from specwatch.collector.reads.queries import Filters, Window
from specwatch.collector.reads.usage import peak_memory, scenario_rows

GIB = 2**30
DETERMINISM_VALUES = ("required", "true", "yes", "1", "strict")
LATENCY_VALUES = ("sensitive", "interactive", "realtime", "high")
GREEDY_IDENTITY = (
    "greedy speculative decoding emits exactly the tokens of plain greedy decoding "
    "(tests/engine/test_greedy_identity.py, every drafter, float32)"
)


@dataclass(frozen=True)
class AdvisorRules:
    min_requests: int = 30
    short_tokens: int = 512
    long_context_tokens: int = 128 * 1024
    edge_memory_bytes: float = 16 * GIB
    ample_headroom: float = 0.2
    pays_speedup: float = 1.05
    hurts_speedup: float = 0.95
    significance: float = 0.05


@dataclass(frozen=True)
class ScenarioEvidence:
    """What was measured for one scenario in the window (None: not measured)."""

    scenario: str
    requests: int
    speculative_requests: int
    drafters: tuple[str, ...]
    context_tokens_p50: float | None  # prompt + output tokens per request
    context_tokens_p90: float | None
    context_tokens_max: float | None
    ttft_p50_s: float | None
    ttft_p99_s: float | None
    acceptance_rate: float | None
    speedup: float | None  # plain s/token / speculative s/token
    p_value: float | None
    compared_by: str | None  # arm (A/B split) | mode
    peak_memory_bytes: float | None
    device_memory_bytes: float | None
    gpu_count: int
    load_mean: float | None
    greedy_share: float | None  # of requests that tag their sampling
    determinism_required: bool
    latency_sensitive: bool
    memory_headroom: float | None = field(init=False)  # 1 - peak / (device memory x gpu_count)

    def __post_init__(self) -> None:
        known = self.peak_memory_bytes is not None and self.device_memory_bytes
        headroom = 1.0 - self.peak_memory_bytes / (self.device_memory_bytes * self.gpu_count) if known else None
        object.__setattr__(self, "memory_headroom", headroom)


ACTION_WORDS = {"enable": "Enable speculation", "disable": "Disable speculation",
                "canary": "Run speculation as a canary (an A/B share)"}  # fmt: skip
RULE_WORDS = {
    "edge_device": "the device is an edge device with little memory",
    "memory_beyond_one_device": "the model needs more than one device's memory",
    "long_context": "the contexts are long",
    "tight_memory": "memory is tight",
    "latency_sensitive_chat": "the traffic is latency-sensitive chat",
    "short_batch": "the requests are short",
    "no_guidance": "no guidance rule applies",
    "insufficient_data": "there are too few requests to judge",
    "measured_slowdown": "speculation measured slower",
    "measured_speedup": "speculation measured faster",
    "unclear": "the measurement is not conclusive",
    "costs_more_per_token": "speculation costs more per token at the load served",
}


@dataclass(frozen=True)
class Recommendation:
    scenario: str
    action: str  # enable | disable | canary
    rule: str  # the rule that decided
    reason: str  # the rule with its numbers, in words
    contradictions: tuple[str, ...]
    evidence: ScenarioEvidence
    sentence: str = field(init=False)  # the advice as one sentence, for people (made from the fields above)

    def __post_init__(self) -> None:
        object.__setattr__(self, "sentence", advice_sentence(self.scenario, self.action, self.rule, self.reason))


def advice_sentence(scenario: str, action: str, rule: str, reason: str) -> str:
    """'Run speculation as a canary (an A/B share) for chat: the guidance that the device is an edge device
    ... says otherwise, but the measurement disagrees (device memory ...; speed-up 3.98x ...).'"""
    doing = f"{ACTION_WORDS.get(action, action)} for {scenario}"
    if rule.endswith("_contradicted"):
        base = rule.removesuffix("_contradicted")
        said = RULE_WORDS.get(base, base.replace("_", " "))
        return f"{doing}: the guidance ({said}) says otherwise, but the measurement disagrees ({reason})."
    return f"{doing}: {RULE_WORDS.get(rule, rule.replace('_', ' '))} ({reason})."


# --- the rules (pure) -------------------------------------------------------------------


def guidance(ev: ScenarioEvidence, rules: AdvisorRules = AdvisorRules()) -> tuple[str | None, str, str]:
    """(enable | disable | None, rule, reason) from the workload's shape alone."""
    headroom = ev.memory_headroom
    if ev.device_memory_bytes is not None and ev.device_memory_bytes <= rules.edge_memory_bytes:
        limit = rules.edge_memory_bytes / GIB
        return "disable", "edge_device", f"device memory {ev.device_memory_bytes / GIB:.1f} GiB <= {limit:.0f} GiB"
    if ev.gpu_count > 1 or (headroom is not None and headroom < 0):
        return (
            "disable",
            "memory_beyond_one_device",
            f"peak memory {_gib(ev.peak_memory_bytes)} on {ev.gpu_count} device(s)",
        )
    if ev.context_tokens_p50 is not None and ev.context_tokens_p50 > rules.long_context_tokens:
        return (
            "disable",
            "long_context",
            f"median context {ev.context_tokens_p50:.0f} tokens > {rules.long_context_tokens}",
        )
    if headroom is not None and headroom < rules.ample_headroom:
        return None, "tight_memory", f"memory headroom {headroom:.0%} < {rules.ample_headroom:.0%}"
    if ev.latency_sensitive:
        return (
            "enable",
            "latency_sensitive_chat",
            f"latency-sensitive (TTFT p99 {_s(ev.ttft_p99_s)}), {_memory_words(headroom)}",
        )
    if ev.context_tokens_p90 is not None and ev.context_tokens_p90 < rules.short_tokens:
        context = f"p90 context {ev.context_tokens_p90:.0f} tokens < {rules.short_tokens}"
        return "enable", "short_batch", f"{context}, {_memory_words(headroom)}"
    return None, "no_guidance", "no guidance rule applies"


def measured_verdict(ev: ScenarioEvidence, rules: AdvisorRules = AdvisorRules()) -> str:
    """pays | hurts | unclear, from the measured speed-up and its significance."""
    if ev.speedup is None or ev.p_value is None or ev.p_value >= rules.significance:
        return "unclear"
    if ev.speedup >= rules.pays_speedup:
        return "pays"
    return "hurts" if ev.speedup <= rules.hurts_speedup else "unclear"


def recommend(ev: ScenarioEvidence, rules: AdvisorRules = AdvisorRules()) -> Recommendation:
    """The decision table of the module docstring."""
    notes = _determinism_notes(ev)
    if ev.requests < rules.min_requests or not ev.speculative_requests:
        why = (
            f"{ev.requests} requests ({ev.speculative_requests} speculative), "
            f"need >= {rules.min_requests} with speculation"
        )
        return Recommendation(ev.scenario, "canary", "insufficient_data", why, notes, ev)
    advice, rule, why = guidance(ev, rules)
    verdict, measured = measured_verdict(ev, rules), _measured_words(ev)
    if advice == "disable" and verdict == "pays":
        notes += (f"guidance says disable ({why}), but measured {measured}" + _ngram_memory_note(ev, rule),)
        return Recommendation(ev.scenario, "canary", f"{rule}_contradicted", f"{why}; {measured}", notes, ev)
    if advice == "enable" and verdict == "hurts":
        notes += (f"guidance says enable ({why}), but measured {measured}",)
        return Recommendation(ev.scenario, "disable", f"{rule}_contradicted", f"{why}; {measured}", notes, ev)
    if advice == "disable" or (advice is None and verdict == "hurts"):
        return Recommendation(
            ev.scenario, "disable", rule if advice else "measured_slowdown", f"{why}; {measured}", notes, ev
        )
    if verdict == "pays" or (advice == "enable" and (ev.speedup is None or ev.speedup >= 1.0)):
        return Recommendation(
            ev.scenario, "enable", rule if advice else "measured_speedup", f"{why}; {measured}", notes, ev
        )
    return Recommendation(ev.scenario, "canary", "unclear", f"{why}; {measured}", notes, ev)


def _determinism_notes(ev: ScenarioEvidence) -> tuple[str, ...]:
    if not ev.determinism_required:
        return ()
    if ev.greedy_share == 1.0:
        return (
            f"determinism is required and all tagged requests are greedy: {GREEDY_IDENTITY}; "
            + "determinism is no reason to disable speculation here",
        )
    return (
        "determinism is required on sampled requests: speculative sampling keeps the target's distribution "
        + "but not per-seed outputs; pin one mode for requests that must reproduce samples",
    )


def _ngram_memory_note(ev: ScenarioEvidence, rule: str) -> str:
    if rule in ("edge_device", "memory_beyond_one_device") and ev.drafters and set(ev.drafters) <= {"ngram"}:
        return "; n-gram drafting holds no draft weights, so the memory rule does not bind"
    return ""


def _measured_words(ev: ScenarioEvidence) -> str:
    if ev.speedup is None:
        return "speed-up not measured (no plain-decoding requests to compare)"
    p = "n/a" if ev.p_value is None else f"{ev.p_value:.3g}"
    rate = "n/a" if ev.acceptance_rate is None else f"{ev.acceptance_rate:.2f}"
    return f"speed-up {ev.speedup:.2f}x (Mann-Whitney p={p}, by {ev.compared_by}), acceptance {rate}"


def _memory_words(headroom: float | None) -> str:
    return "memory not measured" if headroom is None else f"memory headroom {headroom:.0%}"


def _gib(value: float | None) -> str:
    return "n/a" if value is None else f"{value / GIB:.1f} GiB"


def _s(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f} s"


# --- measuring (reads the store) ----------------------------------------------------------


def advise(
    db: Engine,
    window: Window,
    device_memory_bytes: float | None,
    gpu_count: int = 1,
    rules: AdvisorRules = AdvisorRules(),
    filters: Filters = Filters(),
) -> list[Recommendation]:
    """One recommendation per scenario tag value ("untagged" for requests without one)."""
    return [recommend(ev, rules) for ev in scenario_evidence(db, window, device_memory_bytes, gpu_count, filters)]


def scenario_evidence(
    db: Engine,
    window: Window,
    device_memory_bytes: float | None,
    gpu_count: int = 1,
    filters: Filters = Filters(),
) -> list[ScenarioEvidence]:
    table = scenario_rows(db, window, filters)
    if not table:
        return []
    scenario = np.where(np.equal(table["scenario"], None), "untagged", table["scenario"]).astype(str)
    peaks = peak_memory(db, window)
    return [
        _evidence(name, {k: v[scenario == name] for k, v in table.items()}, peaks, device_memory_bytes, gpu_count)
        for name in sorted(set(scenario))
    ]


Columns = dict[str, np.ndarray]


def _evidence(
    name: str, t: Columns, peaks: dict[str, float], device_memory: float | None, gpu_count: int
) -> ScenarioEvidence:
    context, ttft, drafted, accepted, load = (
        t[column].astype(float)
        for column in ("context", "ttft_s", "num_draft_tokens", "num_accepted_tokens", "load_at_admission")
    )
    spec = t["mode"] == "speculative"
    speedup, p_value, by = _speedup(t)
    instance_peaks = [peaks[i] for i in set(t["instance"]) if i in peaks]
    return ScenarioEvidence(
        name,
        len(context),
        int(spec.sum()),
        tuple(sorted(set(t["drafter"][spec]) - {None})),
        *_quantiles(context, (0.5, 0.9, 1.0)),
        *_quantiles(ttft, (0.5, 0.99)),
        float(accepted.sum() / drafted.sum()) if drafted.sum() else None,
        speedup,
        p_value,
        by,
        max(instance_peaks) if instance_peaks else None,
        device_memory,
        gpu_count,
        float(np.nanmean(load)) if np.isfinite(load).any() else None,
        _greedy_share(t),
        bool(_lower_values(t["determinism"]) & set(DETERMINISM_VALUES)),
        "chat" in name.lower() or bool(_lower_values(t["latency"]) & set(LATENCY_VALUES)),
    )


def _lower_values(column: np.ndarray) -> set[str]:
    return {str(v).lower() for v in set(column) if v is not None}


def _speedup(t: Columns) -> tuple[float | None, float | None, str | None]:
    """As `collector.reads.breakdown.compare`: plain mean s/token / speculative mean s/token of ok
    requests, two-sided Mann-Whitney U; by A/B arm when the scenario ran a split, else by mode."""
    from scipy.stats import mannwhitneyu

    by = "arm" if np.not_equal(t["arm"], None).any() else "mode"
    names = ("spec", "control") if by == "arm" else ("speculative", "autoregressive")
    out = t["output_tokens"].astype(float)
    ok = (t["status"] == "ok") & (out > 0)
    per_token = t["e2e_s"].astype(float)[ok] / out[ok]
    spec, plain = (per_token[t[by][ok] == name] for name in names)
    if not spec.size or not plain.size or not spec.mean():
        return None, None, None
    p_value = (
        float(mannwhitneyu(spec, plain, alternative="two-sided").pvalue) if min(spec.size, plain.size) > 1 else None
    )
    return float(plain.mean() / spec.mean()), p_value, by


def _quantiles(values: np.ndarray, qs: tuple[float, ...]) -> list[float | None]:
    values = values[~np.isnan(values)]
    return [float(v) for v in np.quantile(values, qs)] if values.size else [None] * len(qs)


def _greedy_share(t: Columns) -> float | None:
    """Share of the requests that tag temperature or sampling which decode greedily."""
    temperature, sampling = t["temperature"], t["sampling"]
    tagged = np.not_equal(temperature, None) | np.not_equal(sampling, None)
    if not tagged.any():
        return None
    greedy_temperature = {v for v in set(temperature) if _is_zero(v)}
    greedy = np.isin(temperature, list(greedy_temperature)) | np.array([str(v).lower() == "greedy" for v in sampling])
    return float(greedy[tagged].mean())


def _is_zero(value: str | None) -> bool:
    try:
        return value is not None and float(value) == 0.0
    except ValueError:
        return False
